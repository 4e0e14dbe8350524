"""The kube-scheduler extender v1 wire format: parsing ``ExtenderArgs``, encoding results.

The Go types in ``k8s.io/kube-scheduler/extender/v1`` have no JSON tags (docs/kubernetes-interfaces.md 1.1), so the
scheduler sends and expects the Go field names (``Pod``, ``Nodes``, ``NodeNames``, ``Host``,
``Score``, ...), without ``omitempty``, and its decoder matches keys case-insensitively. We accept
any letter case on input and always emit the exact Go names.

Rules taken from the scheduler's side (docs/kubernetes-interfaces.md 2.2, 2.5) that shape the encoders:

* a filter reply must carry ``NodeNames`` (cache mode) or ``Nodes`` (full mode); with neither, or
  with an empty list, the scheduler drops every node;
* a reply must never name a node that was not in the request;
* scores are JSON integers (a float fails the Go decoder and the scores are silently dropped) and
  the prioritize reply is a bare array.

Encoding is on the hot path (one reply per scheduling cycle, up to thousands of names), so the
encoders build the JSON text directly. Node names are DNS subdomains in any real cluster; when every
name is plain printable text without ``"`` or ``\\`` we join them verbatim, otherwise we fall back
to :func:`json.dumps` for correct escaping.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import from_json

from extender.core.errors import ExtenderError


class BadRequestError(ExtenderError):
    """The request body is not an ``ExtenderArgs`` we can read; the reply is HTTP 400."""


def get_ci(obj: Mapping[str, Any], key: str) -> Any:
    """``obj[key]`` matched the way Go's decoder does: exact key first, then any letter case."""
    if key in obj:
        return obj[key]
    low = key.lower()
    for k, v in obj.items():
        if k.lower() == low:
            return v
    return None


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages to a client that sent JSON, not Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def has_ci(obj: Mapping[str, Any], key: str) -> bool:
    """``key`` is in ``obj`` as :func:`get_ci` matches it, whatever its value (``null`` included)."""
    low = key.lower()
    return key in obj or any(k.lower() == low for k in obj)


def _str_map(value: Any) -> dict[str, str]:
    """Labels or annotations; anything that is not a string map counts as empty (not our input to police)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


@dataclass(frozen=True)
class PodInfo:
    """What the extender reads from a Pod: identity for logs, labels and annotations for matching."""

    namespace: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]

    @classmethod
    def from_object(cls, pod: Mapping[str, Any]) -> PodInfo:
        """Read a ``v1.Pod`` (lowercase Kubernetes JSON, matched case-insensitively like Go does)."""
        meta = get_ci(pod, "metadata")
        if not isinstance(meta, dict):
            meta = {}
        ns, name = get_ci(meta, "namespace"), get_ci(meta, "name")
        if not isinstance(name, str) or not name:
            generate = get_ci(meta, "generateName")
            name = f"{generate}<generated>" if isinstance(generate, str) and generate else "<unnamed>"
        return cls(
            namespace=ns if isinstance(ns, str) and ns else "default",
            name=name,
            labels=_str_map(get_ci(meta, "labels")),
            annotations=_str_map(get_ci(meta, "annotations")),
        )

    @property
    def key(self) -> str:
        """``namespace/name`` for logs."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeInfo:
    """What the extender reads from a full ``v1.Node`` (``nodeCacheCapable: false``)."""

    name: str
    labels: dict[str, str]
    #: Every name of every image in ``status.images`` (kubelet reports the 50 largest).
    images: tuple[str, ...]

    @classmethod
    def from_object(cls, node: Mapping[str, Any], index: int | None = None) -> NodeInfo:
        """Read name, labels and ``status.images[].names`` of a Node object; ``index``: its place in
        ``Nodes.items``, named in a message (built only then: this runs once per node per request)."""
        meta = get_ci(node, "metadata")
        name = get_ci(meta, "name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            where = "a node" if index is None else f"Nodes.items[{index}]"
            if meta is not None and not isinstance(meta, dict):
                raise BadRequestError(f"{where}.metadata must be an object, got {json_type(meta)}")
            if name is None:
                raise BadRequestError(f"{where} has no metadata.name")
            raise BadRequestError(f"{where}.metadata.name must be a non-empty string, got "
                                  f"{'an empty string' if name == '' else json_type(name)}")
        status = get_ci(node, "status")
        images: list[str] = []
        raw = get_ci(status, "images") if isinstance(status, dict) else None
        if isinstance(raw, list):
            for image in raw:
                names = get_ci(image, "names") if isinstance(image, dict) else None
                if isinstance(names, list):
                    images.extend(n for n in names if isinstance(n, str))
        return cls(name=name, labels=_str_map(get_ci(meta, "labels")), images=tuple(images))


@dataclass(frozen=True)
class ExtenderArgs:
    """One filter or prioritize request.

    Exactly one of ``node_names`` (``nodeCacheCapable: true``) and ``node_items`` (full NodeList)
    is set; the reply uses the same form.
    """

    pod: PodInfo
    #: Candidate node names in request order (from ``NodeNames``, or the items' ``metadata.name``).
    names: list[str]
    node_names: list[str] | None
    node_items: list[dict[str, Any]] | None
    #: Parsed Node objects in full mode (empty in cache mode).
    nodes: list[NodeInfo]
    #: The raw body held a backslash, so some string in it was escaped (maybe a name).
    escaped: bool

    @property
    def plain(self) -> bool | None:
        """``True`` when no name can need escaping, ``None`` when the encoder must check as it joins.

        Without a backslash in the body no string was escaped, so no name can need escaping (JSON
        text cannot carry a quote or a control character raw). With one (a pod annotation is enough)
        the encoders check the joined text, in the same pass over the names that writes the reply.
        """
        return True if not self.escaped else None

    @property
    def cache_mode(self) -> bool:
        """True when the scheduler sent names only (and expects ``NodeNames`` back)."""
        return self.node_names is not None

    def node_infos(self) -> list[NodeInfo]:
        """Full node information; names-only candidates have no labels or images."""
        if self.node_items is not None:
            return self.nodes
        return [NodeInfo(n, {}, ()) for n in self.names]


#: jiter's fixed nesting limit. A Pod or Node object is a few dozen levels deep; a document deeper
#: than this is not Kubernetes JSON, and without a limit it overflowed Python's stack (a 500).
MAX_JSON_DEPTH = 200


def decode_json(body: bytes) -> Any:
    """Parse a request body as JSON text; raises :class:`BadRequestError` naming the problem.

    pydantic's parser (jiter) instead of :func:`json.loads`: it refuses lone surrogates, which
    ``json.loads`` accepts as valid JSON and which then cannot be written back as UTF-8 (the reply
    failed after it was decided), and it stops at :data:`MAX_JSON_DEPTH` levels instead of raising
    ``RecursionError``. Without string caching it is also about twice as fast as ``json.loads``.
    ``NaN`` and ``Infinity`` are not JSON and are refused; a number too large for a float64 (valid
    JSON, ``1e400``) parses to infinity and is refused when a reply would echo it
    (:func:`encode_filter_result`), as Go's decoder refuses it.
    """
    try:
        return from_json(body, cache_strings=False, allow_inf_nan=False)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise BadRequestError(f"body is nested deeper than {MAX_JSON_DEPTH} levels") from None
        raise BadRequestError(f"body is not valid JSON: {exc}") from None


def parse_args(body: bytes) -> ExtenderArgs:
    """Decode an ``ExtenderArgs`` body; raises :class:`BadRequestError` naming the problem."""
    data = decode_json(body)
    if not isinstance(data, dict):
        raise BadRequestError(f"body must be a JSON object (ExtenderArgs), got {json_type(data)}")
    pod = get_ci(data, "Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("body has no Pod object (ExtenderArgs.Pod)")
    names = get_ci(data, "NodeNames")
    nodes = get_ci(data, "Nodes")
    escaped = b"\\" in body  # see ExtenderArgs.plain
    if names is not None:
        if not isinstance(names, list):
            raise BadRequestError(f"NodeNames must be an array of strings, got {json_type(names)}")
        try:
            "".join(names)  # C-speed type check: raises TypeError on any non-string
        except TypeError:
            at, bad = next((i, n) for i, n in enumerate(names) if not isinstance(n, str))
            raise BadRequestError(f"NodeNames must be an array of strings: NodeNames[{at}] is "
                                  f"{json_type(bad)}") from None
        return ExtenderArgs(PodInfo.from_object(pod), names, names, None, [], escaped)
    if nodes is not None:
        shape = "Nodes must be a NodeList object whose items are Node objects"
        if not isinstance(nodes, dict):  # Go's decoder refuses anything but an object here
            raise BadRequestError(f"{shape}, got {json_type(nodes)}")
        items = get_ci(nodes, "items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequestError(f"{shape}: Nodes.items is {json_type(items)}, not an array")
        for at, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequestError(f"{shape}: Nodes.items[{at}] is {json_type(item)}")
        infos = [NodeInfo.from_object(item, at) for at, item in enumerate(items)]
        all_names = [n.name for n in infos]
        return ExtenderArgs(PodInfo.from_object(pod), all_names, None, items, infos, escaped)
    raise BadRequestError("body has neither NodeNames nor Nodes; nothing to filter or score")


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
#: The bytes of :data:`_NEEDS_ESCAPE` but the quote, which :func:`_plain_ascii` counts instead.
_ESCAPED_BYTES = bytes(range(0x20)) + b"\\\x7f"


def _plain_ascii(text: str, quotes: int) -> bool:
    """ASCII ``text`` holds no control character, no ``\\`` and exactly ``quotes`` double quotes.

    Two C loops over the bytes (``bytes.translate`` deleting the bytes that need escaping, and
    ``bytes.count``); at 15,000 names about five times faster than the regular expression or
    ``str.isprintable``, which look every character up in a table.
    """
    raw = text.encode("ascii")
    return len(raw.translate(None, _ESCAPED_BYTES)) == len(raw) and raw.count(b'"') == quotes


def plain(names: Sequence[str]) -> bool:
    """True when every name can be written inside JSON quotes as it is (no escaping needed).

    ASCII text (every real node name) is checked by :func:`_plain_ascii`; the regular expression
    decides for other text.
    """
    joined = "".join(names)
    if joined.isascii():
        return _plain_ascii(joined, 0)
    return _NEEDS_ESCAPE.search(joined) is None


def _joined_plain(separator: str, names: Sequence[str], is_plain: bool | None) -> str | None:
    """``separator.join(names)`` when every name can stand between JSON quotes as it is, else ``None``.

    ``is_plain`` is what the caller knows (``True``/``False``), or ``None``: then the joined text
    is checked instead of the names, so the names are walked once, not twice. The separator is
    printable ASCII without ``\\``, so the text is plain exactly when it is ASCII without control
    characters or ``\\`` and holds no ``"`` but the separators' own (a non-ASCII name counts as not
    plain: the caller's ``json.dumps`` then escapes it, which is correct, only slower).
    """
    if is_plain is False:
        return None
    joined = separator.join(names)
    if is_plain:
        return joined
    quotes = separator.count('"') * (len(names) - 1)
    return joined if joined.isascii() and _plain_ascii(joined, quotes) else None


def encode_names(names: Sequence[str], is_plain: bool | None = None) -> str:
    """A JSON array of strings (``is_plain``: whether names need escaping, if the caller knows)."""
    if not names:
        return "[]"
    joined = _joined_plain('","', names, is_plain)
    if joined is not None:
        return '["' + joined + '"]'
    return json.dumps(list(names), separators=(",", ":"))


def encode_uniform_priorities(names: Sequence[str], score: int, is_plain: bool | None = None) -> str:
    """``[{"Host":..,"Score":score}, ...]`` with one score for every node (the neutral reply)."""
    if not names:
        return "[]"
    tail = f'","Score":{int(score)}}}'
    joined = _joined_plain(tail + ',{"Host":"', names, is_plain)
    if joined is not None:
        return '[{"Host":"' + joined + tail + "]"
    return json.dumps([{"Host": n, "Score": int(score)} for n in names], separators=(",", ":"))


def priority_fragment(name: str, score: int) -> str:
    """One ``HostPriority`` object as JSON text, for callers that pre-encode per node."""
    return '{"Host":' + json.dumps(name) + ',"Score":' + str(int(score)) + "}"


def fragments_for(names: Sequence[str], scores: Sequence[int]) -> list[str]:
    """One pre-encoded ``HostPriority`` object per node (built once per inventory snapshot)."""
    if plain(names):
        return [f'{{"Host":"{n}","Score":{int(s)}}}' for n, s in zip(names, scores, strict=True)]
    return [priority_fragment(n, s) for n, s in zip(names, scores, strict=True)]


def encode_priorities(pairs: Iterable[tuple[str, int]]) -> str:
    """``HostPriorityList`` from (host, score) pairs."""
    return json.dumps([{"Host": h, "Score": int(s)} for h, s in pairs], separators=(",", ":"))


def encode_filter_result(
    args: ExtenderArgs,
    passing: Sequence[int] | None,
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    *,
    error: str = "",
) -> str:
    """``ExtenderFilterResult`` in the request's own form.

    ``passing`` lists the positions (in request order) of nodes that pass; ``None`` means all of
    them. Every key is written, as Go writes it: ``Nodes`` and ``NodeNames`` both appear, one of
    them ``null``.
    """
    tail = (
        ',"FailedNodes":' + json.dumps(dict(failed), separators=(",", ":"))
        + ',"FailedAndUnresolvableNodes":' + json.dumps(dict(unresolvable), separators=(",", ":"))
        + ',"Error":' + json.dumps(error) + "}"
    )
    if args.node_names is not None:
        all_names = args.node_names
        kept = all_names if passing is None else [all_names[i] for i in passing]
        return '{"Nodes":null,"NodeNames":' + encode_names(kept, args.plain) + tail
    items = args.node_items or []
    kept_items = items if passing is None else [items[i] for i in passing]
    try:
        node_list = json.dumps({"metadata": {}, "items": kept_items}, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise BadRequestError("Nodes holds a number beyond the float64 range (it would be echoed as "
                              "Infinity, which is not JSON and which the scheduler's decoder refuses)") from None
    return '{"Nodes":' + node_list + ',"NodeNames":null' + tail


def encode_error(message: str) -> str:
    """The JSON body of a 4xx/5xx reply."""
    return json.dumps({"error": message})
