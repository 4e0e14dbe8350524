"""The container runtime's CRI image service, as the node agent calls it (``extender agent --cri-socket``).

``api.proto`` is the part of Kubernetes' Container Runtime Interface (package ``runtime.v1``) that
lists images, trimmed from k8s.io/cri-api; ``api_pb2*.py`` are generated from it by
``scripts/generate-grpc-stubs``; :mod:`~extender.cri.images` makes the call. Besides
:mod:`extender.keda`, the only package that imports grpc. Importing this package itself does not:
what the agent needs to handle a failure (:class:`ImageListError`, :data:`REASONS`) is here.
"""

from __future__ import annotations

from typing import Literal, get_args

from extender.core.errors import ExtenderError

#: Why a list failed: ``unreachable`` (no socket, nothing listening, or the runtime not serving:
#: gRPC's UNAVAILABLE), ``timeout`` (no answer within the deadline), ``unimplemented`` (the socket
#: serves no CRI ``runtime.v1`` image service: a runtime without its CRI plugin, or CRI before
#: v1), ``too-large`` (an answer over :data:`extender.cri.images.MAX_MESSAGE_BYTES`), ``error``
#: (any other gRPC status).
Reason = Literal["unreachable", "timeout", "unimplemented", "too-large", "error"]
REASONS: tuple[Reason, ...] = get_args(Reason)


class ImageListError(ExtenderError):
    """The container runtime did not list its images; ``reason`` says why in one word (:data:`REASONS`)."""

    def __init__(self, message: str, reason: Reason) -> None:
        super().__init__(message)
        self.reason: Reason = reason
