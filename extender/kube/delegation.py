"""Delegated authentication and authorization for the External Metrics API: the three cluster calls it makes.

An aggregated API server does not keep users of its own; it asks the cluster (docs/kubernetes-interfaces.md 4.6):

* ``TokenReview`` (``authentication.k8s.io/v1``): who does this bearer token belong to?
* ``SubjectAccessReview`` (``authorization.k8s.io/v1``): may this user ``list`` this metric?
* the ConfigMap ``kube-system/extension-apiserver-authentication``: which CA signs the front
  proxy's client certificate (``requestheader-client-ca-file``), which names it may carry, which
  headers carry the identity, and which CA signs ordinary client certificates (``client-ca-file``).

RBAC for these: ClusterRole ``system:auth-delegator`` (the two reviews) and Role
``extension-apiserver-authentication-reader`` in ``kube-system`` (the ConfigMap), both bound to
the scaler's ServiceAccount by the chart (deploy/helm/extender/templates/external-metrics.yaml).

Plain values in and out (our errors on failure, the client's models never leave this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.kube.client import CONNECT_TIMEOUT_S, api_client, k8s, read_json
from extender.kube.errors import kube_errors

#: Seconds to wait for one review (the HPA's request is waiting on it).
REVIEW_TIMEOUT_S = 10.0
AUTH_CONFIGMAP_NAMESPACE = "kube-system"
AUTH_CONFIGMAP_NAME = "extension-apiserver-authentication"


@dataclass(frozen=True)
class TokenIdentity:
    """The identity a TokenReview returned for an authenticated token."""

    username: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class Delegation:
    """TokenReview, SubjectAccessReview and the authentication ConfigMap (module docstring)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client
        self._authn: Any = k8s.AuthenticationV1Api(api_client)
        self._authz: Any = k8s.AuthorizationV1Api(api_client)
        self._core: Any = k8s.CoreV1Api(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, context: str | None = None) -> Delegation:
        """Built like :meth:`extender.kube.client.KubeClient.connect` (kubeconfig, service account, default)."""
        return cls(api_client(kubeconfig, context))

    def close(self) -> None:
        self._api.close()

    def review_token(self, token: str, audiences: Sequence[str] = ()) -> TokenIdentity | None:
        """The token's identity, or ``None`` when the cluster says it is not authenticated."""
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        body = k8s.V1TokenReview.from_dict({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                            "spec": spec})
        with kube_errors("reviewing a bearer token (TokenReview)"):
            review = read_json(self._authn.create_token_review(
                body, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, REVIEW_TIMEOUT_S)), "TokenReview")
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        return TokenIdentity(
            username=str(user.get("username") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )

    def review_access(self, user: str, groups: Sequence[str], extra: Mapping[str, Sequence[str]], *,
                      verb: str, group: str, version: str, resource: str, namespace: str) -> tuple[bool, str]:
        """``(allowed, reason)`` of a SubjectAccessReview for a resource request."""
        spec: dict[str, Any] = {
            "user": user,
            "groups": list(groups),
            "resourceAttributes": {"verb": verb, "group": group, "version": version, "resource": resource,
                                   "namespace": namespace},
        }
        if extra:
            spec["extra"] = {k: list(v) for k, v in extra.items()}
        body = k8s.V1SubjectAccessReview.from_dict({"apiVersion": "authorization.k8s.io/v1",
                                                    "kind": "SubjectAccessReview", "spec": spec})
        with kube_errors("authorizing a request (SubjectAccessReview)"):
            review = read_json(self._authz.create_subject_access_review(
                body, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, REVIEW_TIMEOUT_S)),
                "SubjectAccessReview")
        status = review.get("status") or {}
        return bool(status.get("allowed")) and not status.get("denied"), str(status.get("reason") or "")

    def authentication_config(self, namespace: str = AUTH_CONFIGMAP_NAMESPACE,
                              name: str = AUTH_CONFIGMAP_NAME) -> dict[str, str]:
        """The data of the cluster's ``extension-apiserver-authentication`` ConfigMap."""
        with kube_errors(f"reading ConfigMap {namespace}/{name}"):
            obj = read_json(self._core.read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, REVIEW_TIMEOUT_S)),
                f"reading ConfigMap {namespace}/{name}")
        data = obj.get("data") or {}
        return {str(k): str(v) for k, v in data.items()}
