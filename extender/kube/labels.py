"""Mirror weights readiness onto Node labels: ``extender.io/<workload>.weights=ready``.

Optional (``extender agent --label-nodes``), for people: ``kubectl get nodes -L
extender.io/qwen3-moe.weights`` shows which nodes hold complete weights, the way managed offerings
label cache-ready nodes. The scheduler extender does not read these labels; it reads the inventory.

The agent owns only labels with the ``extender.io/`` prefix and the ``.weights`` suffix: it sets
them for workloads with a complete weights directory and removes the ones that no longer hold.
It reads the node's current labels (GET) once, and again when asked (the agent asks every
``label_resync_s``, ten minutes by default, so a label someone removed or a Node registered anew
gets its labels back), and sends a JSON merge patch only when the set differs: a steady node costs
the API server one GET per resync.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from extender.kube.client import KubeClient

PREFIX = "extender.io/"
SUFFIX = ".weights"
READY = "ready"

# the name part of a label key: at most 63 characters, alphanumerics at both ends
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def label_key(workload: str) -> str | None:
    """The label for a workload, or ``None`` when the workload name cannot form a valid key."""
    name = f"{workload}{SUFFIX}"
    if len(name) > 63 or not _NAME.fullmatch(name):
        return None
    return PREFIX + name


def is_managed(key: str) -> bool:
    return key.startswith(PREFIX) and key.endswith(SUFFIX)


def label_patch(current: Mapping[str, str], ready: Iterable[str]) -> dict[str, str | None]:
    """Labels to set (``"ready"``) or delete (``None``) so the managed labels say exactly ``ready``."""
    wanted = {k for k in map(label_key, ready) if k is not None}
    patch: dict[str, str | None] = {k: READY for k in sorted(wanted) if current.get(k) != READY}
    patch.update({k: None for k in sorted(current) if is_managed(k) and k not in wanted})
    return patch


class NodeLabeler:
    """Applies readiness labels to one Node."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        self._labels: dict[str, str] | None = None

    def apply(self, ready: Iterable[str], *, refresh: bool = False) -> bool:
        """Make the node's managed labels match ``ready``, reading them from the API first when
        ``refresh`` (or not known yet); True if a patch was sent. Raises KubeError."""
        if refresh or self._labels is None:
            node = self.client.get_node(self.node_name)
            self._labels = dict(node.get("metadata", {}).get("labels") or {})
        patch = label_patch(self._labels, ready)
        if not patch:
            return False
        try:
            node = self.client.patch_node(self.node_name, {"metadata": {"labels": patch}})
        except Exception:
            self._labels = None  # we no longer know what is on the node: read it again next time
            raise
        self._labels = dict(node.get("metadata", {}).get("labels") or {})
        return True
