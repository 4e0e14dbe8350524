"""The protocol floor: the cheapest correct extender, to measure ours against.

It reads the body the same way (:func:`extender.api.scheduler.verbs.read_body`, one read of
``Content-Length`` bytes), parses the same ``ExtenderArgs`` with the same code and answers with the
same encoders (every node passes; every score 0), served by the same gunicorn stack. Whatever it costs is what the
extender protocol itself costs on this machine (HTTP, JSON in, JSON out); the benchmark reports our
latency as a ratio to it. It has no metrics and no snapshot, so the ratio is, if anything, unkind
to the real app.
"""

from __future__ import annotations

from flask import Flask, Response

from extender.api.scheduler.verbs import read_body
from extender.api.scheduler.wire import (
    BadRequestError,
    encode_error,
    encode_filter_result,
    encode_uniform_priorities,
    parse_args,
)

JSON = "application/json"
#: The extender's default body limit (``Settings.max_body_bytes``).
MAX_BODY = 64 * 2**20


def create_floor_app() -> Flask:
    """A Flask app answering ``/filter`` and ``/prioritize`` neutrally, and ``/healthz``."""
    app = Flask("extender.floor")

    @app.post("/filter")
    def filter_nodes() -> Response:
        try:
            args = parse_args(read_body(MAX_BODY))
        except BadRequestError as exc:
            return Response(encode_error(str(exc)), status=400, mimetype=JSON)
        return Response(encode_filter_result(args, None, {}, {}), mimetype=JSON)

    @app.post("/prioritize")
    def prioritize_nodes() -> Response:
        try:
            args = parse_args(read_body(MAX_BODY))
        except BadRequestError as exc:
            return Response(encode_error(str(exc)), status=400, mimetype=JSON)
        return Response(encode_uniform_priorities(args.names, 0, args.plain), mimetype=JSON)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response('{"status":"ok"}', mimetype=JSON)

    return app
