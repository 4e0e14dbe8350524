"""kube-scheduler's default placement, as far as it decides where an inference pod lands.

Reproduced (integer arithmetic as in the Go code, so scores match upstream exactly):

* **NodeResourcesFit** filter (the pod's GPUs fit in the node's free GPUs) and score with the
  default ``LeastAllocated`` strategy, on GPUs::

      score = (allocatable - (allocated + request)) x 100 // allocatable     (0 when it does not fit)

  Upstream scores ``cpu`` and ``memory`` by default; GPU pods request those roughly in proportion to
  their GPUs, so scoring the GPUs ranks nodes the same way without inventing CPU figures.
* **ImageLocality** (``pkg/scheduler/framework/plugins/imagelocality``; docs/prior-art.md Part A 1.1,
  docs/kubernetes-interfaces.md 5)::

      scaled_i = int(size_i x num_nodes_i / total_nodes)      per image of the pod present on the node
      sum      = clamp(sum_i scaled_i, 23 MiB, 1000 MiB x containers)
      score    = 100 x (sum - 23 MiB) // (1000 MiB x containers - 23 MiB)

* Default plugin weights: NodeResourcesFit 1, ImageLocality 1 (the v1 default profile).
* The extender's prioritize score adds ``score x weight x 10`` (docs/kubernetes-interfaces.md 2.5), and the highest
  total wins, ties broken uniformly at random (a seeded generator here).

Left out, because they do not separate the candidates of this model: TaintToleration, NodeAffinity
(a profile's node classes are a filter here), PodTopologySpread's default soft constraints,
InterPodAffinity, NodeResourcesBalancedAllocation (it balances cpu against memory, which the model
does not have), VolumeBinding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]
Mask = NDArray[np.bool_]

MiB = 2**20
#: ImageLocality's thresholds: "90%ile of images on dockerhub drops into this range".
MIN_THRESHOLD = 23 * MiB
MAX_CONTAINER_THRESHOLD = 1000 * MiB
#: ``framework.MaxNodeScore``.
MAX_NODE_SCORE = 100
#: ``MaxNodeScore / MaxExtenderPriority``: the extender's 0..10 becomes 0..100 per unit of weight.
EXTENDER_SCALE = 10
#: Weights of the default profile (KubeSchedulerConfiguration v1).
NODE_RESOURCES_FIT_WEIGHT = 1
IMAGE_LOCALITY_WEIGHT = 1


def scaled_image_score(size_bytes: int, num_nodes: int, total_nodes: int) -> int:
    """``int64(float64(size) x NumNodes / TotalNumNodes)``: the spread-adjusted size of one image."""
    spread = float(num_nodes) / float(total_nodes)
    return int(float(size_bytes) * spread)  # Go's float -> int64 conversion truncates


def image_locality_priority(sum_scores: I64 | int, num_containers: int) -> I64:
    """``calculatePriority``: the clamped, scaled 0..100 score of summed image scores."""
    max_threshold = MAX_CONTAINER_THRESHOLD * num_containers
    s = np.clip(np.asarray(sum_scores, dtype=np.int64), MIN_THRESHOLD, max_threshold)
    return np.asarray(MAX_NODE_SCORE * (s - MIN_THRESHOLD) // (max_threshold - MIN_THRESHOLD), dtype=np.int64)


def image_locality(present: Mask, sizes: Sequence[int], total_nodes: int, num_containers: int | None = None) -> I64:
    """ImageLocality scores of n nodes for a pod whose images have ``sizes`` (bytes).

    ``present[i, j]``: node i holds image j. ``num_containers`` defaults to the number of images
    (one image per container). No nodes at all (``total_nodes`` 0) score nothing.
    """
    p = np.asarray(present, dtype=np.bool_).reshape(-1, len(sizes))
    if total_nodes == 0:  # no node to score (an autoscaled pool with none yet): nothing to spread over
        return np.zeros(len(p), dtype=np.int64)
    counts = p.sum(axis=0)
    per_image = np.array([scaled_image_score(int(s), int(c), total_nodes) for s, c in zip(sizes, counts, strict=True)],
                         dtype=np.int64)
    sums = np.where(p, per_image[None, :], 0).sum(axis=1).astype(np.int64)
    return image_locality_priority(sums, len(sizes) if num_containers is None else num_containers)


def least_allocated(allocatable: I64, allocated: I64, request: int) -> I64:
    """NodeResourcesFit ``LeastAllocated`` on one resource: ``(cap - (used + req)) x 100 // cap``.

    0 where the node has no allocatable or the request does not fit (upstream's guard).
    """
    cap = np.asarray(allocatable, dtype=np.int64)
    req = np.asarray(allocated, dtype=np.int64) + request
    safe = np.maximum(cap, 1)
    score = (cap - req) * MAX_NODE_SCORE // safe
    return np.asarray(np.where((cap > 0) & (req <= cap), score, 0), dtype=np.int64)


def in_tree_scores(allocatable: I64, allocated: I64, request: int, image_present: Mask, image_bytes: int) -> I64:
    """Weighted sum of the default plugins that matter here, for a one-container pod."""
    total = len(image_present)
    fit = least_allocated(allocatable, allocated, request)
    image = image_locality(image_present.reshape(-1, 1), [image_bytes], total)
    return np.asarray(NODE_RESOURCES_FIT_WEIGHT * fit + IMAGE_LOCALITY_WEIGHT * image, dtype=np.int64)


def select_host(feasible: Mask, totals: I64, rng: np.random.Generator | None) -> int | None:
    """The feasible node with the highest total; ties uniformly at random (the first, without ``rng``)."""
    idx = np.flatnonzero(feasible)
    if len(idx) == 0:
        return None
    scores = totals[idx]
    best = idx[scores == scores.max()]
    if len(best) == 1 or rng is None:
        return int(best[0])
    return int(best[int(rng.integers(len(best)))])
