"""A local double of the Kubernetes API server for tests (real REST paths and JSON over HTTP).

See :mod:`tests.kube_double.server` for what it serves and why it is ours.
"""

from __future__ import annotations

from tests.kube_double.kinds import KINDS, Kind
from tests.kube_double.rbac import Authorizer, Request
from tests.kube_double.server import KubeDouble
from tests.kube_double.state import ApiError

__all__ = ["KINDS", "ApiError", "Authorizer", "Kind", "KubeDouble", "Request"]
