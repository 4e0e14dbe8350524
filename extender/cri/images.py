"""List the images a container runtime holds over its CRI socket (``runtime.v1.ImageService/ListImages``).

One call per :func:`list_images`, on a channel opened for it and closed after: a runtime that
restarts (a new socket file) is reached again at the next call, without gRPC's reconnect backoff
(up to two minutes) in between. A unix-socket connection costs well under a millisecond, against
the agent's scan interval of seconds.

Bounds: the call has a deadline (``timeout_s``); the answer may be up to
:data:`MAX_MESSAGE_BYTES` (kubelet's own limit for CRI answers, 16 MiB: thousands of images; a
larger answer fails as ``too-large``). Every failure is a :class:`ImageListError` with a short
``reason`` (:data:`extender.cri.REASONS`) for the agent's log and metric.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import grpc

from extender.cri import ImageListError, Reason, api_pb2, api_pb2_grpc

#: The largest ListImages answer taken, in bytes (kubelet's limit for CRI messages).
MAX_MESSAGE_BYTES = 16 << 20

_REASON_OF: dict[grpc.StatusCode, Reason] = {
    grpc.StatusCode.UNAVAILABLE: "unreachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "too-large",
}


def image_names(images: Iterable[api_pb2.Image]) -> tuple[str, ...]:
    """Every name of every image: its repo digests, then its repo tags, as kubelet lists an image's
    ``names`` in ``status.images``; the largest image first (ties by image id), each name once.

    Largest first for the same reason as kubelet: a report that cannot hold every name keeps the
    first (:func:`extender.core.reports.fit_agent_report`), and a large image is the one whose pull
    a placement saves. The order is the same from call to call for the same images, so an
    unchanged runtime gives an unchanged report.
    """
    ordered = sorted(images, key=lambda image: (-image.size, image.id))
    return tuple(dict.fromkeys(name for image in ordered for name in (*image.repo_digests, *image.repo_tags)))


def list_images(socket: Path, timeout_s: float) -> tuple[str, ...]:
    """The names of every image the runtime at ``socket`` holds (:func:`image_names`).

    Raises :class:`ImageListError` when the runtime does not answer within ``timeout_s`` seconds
    or answers with an error; its message names the socket and what went wrong.
    """
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(f"unix:{socket}", options=options) as channel:
        try:
            reply = api_pb2_grpc.ImageServiceStub(channel).ListImages(api_pb2.ListImagesRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise _failure(socket, timeout_s, exc) from None
    return image_names(reply.images)


def _failure(socket: Path, timeout_s: float, exc: grpc.RpcError) -> ImageListError:
    """The :class:`ImageListError` of a failed call, in one line."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    reason = _REASON_OF.get(code, "error")
    if reason == "unreachable" and not socket.exists():
        what = "no socket there (is the runtime running, and is its directory mounted into the agent's pod?)"
    elif reason == "unreachable":
        what = f"the runtime does not answer ({' '.join(details.split())})"
    elif reason == "timeout":
        what = f"no answer within {timeout_s:g}s"
    elif reason == "unimplemented":
        what = "it serves no CRI runtime.v1 image service (is it a CRI runtime, with its CRI plugin on?)"
    elif reason == "too-large":
        what = f"the image list is larger than the {MAX_MESSAGE_BYTES >> 20} MiB taken ({' '.join(details.split())})"
    else:
        what = f"{code.name}: {' '.join(details.split())}"
    return ImageListError(f"container runtime at {socket}: {what}", reason)
