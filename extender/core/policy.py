"""The policy file: node classes, workload profiles, and the knobs for scoring, scaling and warming.

Platform teams write it by hand, so it is strict (unknown fields are errors, every problem is
reported at once with file, line and dotted path) and pleasant (human units: ``64GiB``,
``40Gbps``, ``53s``). Example::

    apiVersion: extender.io/v1alpha1
    kind: Policy
    nodeClasses:
      - name: p5.48xlarge
        matchLabels: {node.kubernetes.io/instance-type: p5.48xlarge}
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvme: {capacity: 30TB, readBandwidth: 30GB/s}
        network: {nic: 3200Gbps}
    profiles:
      - name: qwen3-moe
        match: {labels: {extender.io/workload: qwen3-moe}}
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://models/qwen3/", version: rev-1, bytes: 64GiB, shardFiles: 17}
        compile: {cold: 53s, warm: 4s}

Field defaults come from :mod:`extender.core.defaults`, each traced to a source document.

Checks that span fields (``cross_check``) run after every field is valid: a profile naming a node
class that does not exist, a tensor-parallel degree larger than the GPUs of every class it may run
on, weights larger than every NVMe while the profile requires a weights cache.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from extender.core import defaults
from extender.core.cachekey import CompileKeyInputs
from extender.core.document import Loc, compose, format_path, line_of, validate
from extender.core.errors import DocumentError, PolicyError, Problem, UnknownNameError
from extender.core.schema import Schema
from extender.core.units import Bandwidth, Bytes, Duration

API_VERSION = "extender.io/v1alpha1"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _name(value: str) -> str:
    if not _NAME.match(value) or len(value) > 63:
        raise ValueError(
            f"{value!r} is not a valid name: lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return value


Name = Annotated[str, AfterValidator(_name)]
PositiveBandwidth = Annotated[Bandwidth, Field(gt=0)]
PositiveBytes = Annotated[Bytes, Field(gt=0)]


# ---------------------------------------------------------------------------------------------
# Node classes
# ---------------------------------------------------------------------------------------------


class Gpu(Schema):
    """The accelerators of a node class."""

    product: str = Field(min_length=1, description="as in the nvidia.com/gpu.product label")
    count: int = Field(ge=1, le=64)


class Nvme(Schema):
    """Local NVMe used as the node's cache root. ``capacity: 0`` means the class has none."""

    capacity: Bytes
    read_bandwidth: PositiveBandwidth = defaults.NVME_READ_BPS
    #: Space the warmer and the scorer never plan to fill (room for logs, images, scratch).
    reserve: Bytes = 0

    @model_validator(mode="after")
    def _reserve_fits(self) -> Nvme:
        if self.reserve > self.capacity:
            raise ValueError("reserve is larger than capacity")
        return self


class Network(Schema):
    """What the node can pull, and how fast."""

    nic: PositiveBandwidth = defaults.NIC_BPS
    object_store_per_stream: PositiveBandwidth = defaults.OBJECT_STORE_STREAM_BPS
    image_pull: PositiveBandwidth = defaults.IMAGE_PULL_BPS


class NodeClass(Schema):
    """A kind of node, recognised by its labels (all must match)."""

    name: Name
    match_labels: dict[str, str] = Field(min_length=1)
    gpu: Gpu
    nvme: Nvme
    network: Network = Network()

    def matches(self, labels: dict[str, str]) -> bool:
        """True when every ``matchLabels`` entry is on the node with the same value."""
        return all(labels.get(k) == v for k, v in self.match_labels.items())


#: Stands for a node that matches no class: no NVMe, seed-default bandwidths. Unknown means cold
#: and slow, never optimistic.
UNKNOWN_CLASS = NodeClass.model_validate(
    {"name": "unknown", "matchLabels": {"extender.io/unknown": "true"},
     "gpu": {"product": "unknown", "count": 1}, "nvme": {"capacity": 0}}
)


# ---------------------------------------------------------------------------------------------
# Workload profiles
# ---------------------------------------------------------------------------------------------


class PodMatch(Schema):
    """How a pod is recognised: every listed label and annotation must be present with that value."""

    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    @model_validator(mode="after")
    def _not_empty(self) -> PodMatch:
        if not self.labels and not self.annotations:
            raise ValueError("give at least one label or annotation, or every pod would match")
        return self

    def matches(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        """True when the pod carries every listed label and annotation."""
        return all(labels.get(k) == v for k, v in self.labels.items()) and all(
            annotations.get(k) == v for k, v in self.annotations.items()
        )


class Image(Schema):
    """The serving container image."""

    reference: str = Field(min_length=1)
    size: PositiveBytes = defaults.IMAGE_BYTES


WeightsCache = Literal["required", "preferred", "none"]


class Weights(Schema):
    """Model weights: where they live and how the loader reads them.

    ``cache`` says what the profile expects of node NVMe: ``required`` (the weights must be cached
    locally; a class whose NVMe cannot hold them is unusable), ``preferred`` (cache when there is
    room), ``none`` (always stream from the source).
    """

    source: str = Field(min_length=1, description="URI: s3://, gs://, hf://, file://, ...")
    version: str = Field(min_length=1)
    bytes: PositiveBytes
    shard_files: int = Field(default=0, ge=0, description="0: derived from bytes and a 3.9 GiB shard")
    loader_concurrency: int = Field(default=defaults.LOADER_CONCURRENCY, ge=1)
    #: Per-stream object-store throughput this loader configuration achieves, when it differs from
    #: the node class's (000_50d9940bc719df97.txt: chunk size changes what one worker gets).
    stream_bandwidth: PositiveBandwidth | None = None
    cache: WeightsCache = "preferred"

    @property
    def shards(self) -> int:
        """Shard files, derived from the size when not given (at least one)."""
        return self.shard_files or max(1, -(-self.bytes // defaults.SHARD_BYTES))

    @property
    def streams(self) -> int:
        """Parallel object-store streams: one serial stream per file, capped by the loader's workers."""
        return min(self.shards, self.loader_concurrency)


class Parallelism(Schema):
    """Tensor and pipeline parallel degree (GPUs per replica = tensor x pipeline)."""

    tensor: int = Field(default=1, ge=1)
    pipeline: int = Field(default=1, ge=1)

    @property
    def gpus(self) -> int:
        """GPUs one replica occupies."""
        return self.tensor * self.pipeline


class Compile(Schema):
    """torch.compile: seconds from scratch, seconds from a cache on the node, artifact size, key."""

    cold: Duration = defaults.COMPILE_COLD_S
    warm: Duration = defaults.COMPILE_WARM_S
    artifact_bytes: Bytes = defaults.COMPILE_ARTIFACT_BYTES
    key: CompileKeyInputs | None = None

    @model_validator(mode="after")
    def _warm_not_slower(self) -> Compile:
        if self.warm > self.cold:
            raise ValueError("warm (from cache) is slower than cold (from scratch)")
        return self


class Snapshot(Schema):
    """A process snapshot (e.g. CRIU + cuda-checkpoint) restorable on nodes of one class."""

    bytes: PositiveBytes
    restore: Duration


class Capacity(Schema):
    """What one ready replica serves, in the unit the demand signal is measured in."""

    per_replica: float = Field(gt=0)
    unit: Literal["requests/s", "tokens/s"] = "requests/s"


class PhaseOverride(Schema):
    """Phase times for one node class, where they differ (a B200 compiles faster than an H200)."""

    compile_cold: Duration | None = None
    compile_warm: Duration | None = None
    graph_capture: Duration | None = None
    engine_init: Duration | None = None
    snapshot_restore: Duration | None = None


class FilterRules(Schema):
    """Hard rules, all off by default: warmth should raise a score, not exclude a node."""

    require_nvme_fit: bool = False
    require_startup_within_slo: bool = False


class Profile(Schema):
    """A workload: how to recognise its pods and everything that decides how fast they start."""

    name: Name
    match: PodMatch
    node_classes: tuple[str, ...] = Field(default=(), description="classes it may run on; empty: any")
    image: Image
    weights: Weights
    parallelism: Parallelism = Parallelism()
    compile: Compile = Compile()
    graph_capture: Duration = defaults.GRAPH_CAPTURE_S
    engine_init: Duration = defaults.ENGINE_INIT_S
    snapshot: Snapshot | None = None
    capacity: Capacity | None = None
    startup_slo: Duration | None = None
    overrides: dict[str, PhaseOverride] = {}
    filter: FilterRules = FilterRules()

    @model_validator(mode="after")
    def _slo_rule_needs_slo(self) -> Profile:
        if self.filter.require_startup_within_slo and self.startup_slo is None:
            raise ValueError("filter.requireStartupWithinSlo is set but startupSlo is not")
        return self

    def matches(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        """True when a pod with these labels and annotations belongs to this workload."""
        return self.match.matches(labels, annotations)


# ---------------------------------------------------------------------------------------------
# Knobs for the extender, the scaler and the warmer
# ---------------------------------------------------------------------------------------------


class Scoring(Schema):
    """How estimated seconds become the extender's 0..10 score."""

    #: Seconds saved worth one point (absolute, so one point means the same on every request).
    seconds_per_point: Annotated[Duration, Field(gt=0)] = 30.0
    #: Points taken off a node whose free NVMe cannot hold the weights without eviction.
    nvme_pressure_penalty: int = Field(default=2, ge=0, le=10)


class Scaling(Schema):
    """The predictive scaler: its loop, the forecaster (extender.core.forecast) and the decision
    (extender.core.scaler)."""

    tick: Annotated[Duration, Field(gt=0)] = defaults.TICK_S
    hpa_sync_delay: Duration = defaults.TICK_S
    forecaster: Literal["ewma", "holt", "holt-winters"] = "holt"
    scale_down_stabilisation: Duration = 300.0
    #: Upper quantile of forecast demand that capacity is sized for (AHPA's template: 95).
    quantile: float = Field(default=0.95, gt=0.5, lt=1)
    #: Smoothing of level, trend and daily season; see extender.core.forecast.ForecastParams.
    alpha: float = Field(default=0.3, gt=0, le=1)
    beta: float = Field(default=0.05, ge=0, le=1)
    gamma: float = Field(default=0.2, ge=0, le=1)
    #: Season of Holt-Winters (a day) and the forecast grid step (unset: the history's own spacing).
    season: Annotated[Duration, Field(gt=0)] = 86_400.0
    step: Annotated[Duration, Field(gt=0)] | None = None
    #: Seconds within which the reactive need drains the current queue.
    queue_drain: Annotated[Duration, Field(gt=0)] = 60.0
    #: The HPA's tolerance (protocols.md section 4.3); the decision mirrors it to say what will happen.
    tolerance: float = Field(default=0.1, ge=0, lt=1)


class Warming(Schema):
    """The cache warmer: what it may start each tick (planner: extender.core.warming). Off unless enabled.

    ``enabled`` gates the executor; the planner plans regardless, so a dry run shows what enabling
    would do.
    """

    enabled: bool = False
    #: Workloads staged on every fresh node of a class they may run on, when free NVMe allows (no
    #: evictions for this), and whose current caches are never evicted by the warmer.
    keep_warm: tuple[str, ...] = ()
    #: Warm actions running at once on one node and in the cluster, counting those in flight.
    max_concurrent_per_node: int = Field(default=1, ge=1)
    max_concurrent: int = Field(default=4, ge=1)
    #: Bytes the actions planned in one tick may move in total (object store and registry egress);
    #: unset: no limit.
    bytes_per_tick: PositiveBytes | None = None
    #: A cache used more recently than this is not evicted: it is likely wanted again soon, and
    #: evicting it to warm something else only moves the cold start elsewhere.
    evict_after_idle: Duration = 600.0


class Metadata(Schema):
    """Identification only."""

    name: str = ""
    description: str = ""


class Policy(Schema):
    """A whole policy file."""

    api_version: Literal["extender.io/v1alpha1"]
    kind: Literal["Policy"]
    metadata: Metadata = Metadata()
    node_classes: tuple[NodeClass, ...] = ()
    profiles: tuple[Profile, ...] = ()
    scoring: Scoring = Scoring()
    scaling: Scaling = Scaling()
    warming: Warming = Warming()

    def node_class(self, name: str) -> NodeClass:
        """The node class called ``name``."""
        for c in self.node_classes:
            if c.name == name:
                return c
        raise UnknownNameError(f"no node class {name!r} (known: {', '.join(c.name for c in self.node_classes)})")

    def profile(self, name: str) -> Profile:
        """The workload profile called ``name``."""
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles) or "none"
        raise UnknownNameError(f"no workload profile {name!r} (known: {known})")

    def classes_for(self, profile: Profile) -> tuple[NodeClass, ...]:
        """The node classes a profile may run on."""
        if not profile.node_classes:
            return self.node_classes
        return tuple(self.node_class(n) for n in profile.node_classes)

    def classify_node(self, labels: dict[str, str]) -> NodeClass:
        """The first class whose labels match, or :data:`UNKNOWN_CLASS`."""
        return next((c for c in self.node_classes if c.matches(labels)), UNKNOWN_CLASS)

    def profile_for_pod(self, labels: dict[str, str], annotations: dict[str, str]) -> Profile | None:
        """The first profile a pod matches, or ``None`` (the extender then stays neutral)."""
        return next((p for p in self.profiles if p.matches(labels, annotations)), None)


# ---------------------------------------------------------------------------------------------
# Checks across fields, and loading
# ---------------------------------------------------------------------------------------------


def _duplicates(names: list[str]) -> Iterator[int]:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            yield i
        seen.add(n)


def cross_check(policy: Policy) -> list[tuple[Loc, str]]:
    """Problems that involve several fields, as ``(location, message)`` pairs."""
    out: list[tuple[Loc, str]] = []
    if not policy.node_classes:
        # checked here rather than with min_length: pydantic would also report it whenever a class
        # merely has an invalid field, which is noise next to the real problem
        out.append((("nodeClasses",), "at least one node class is required"))
    class_names = [c.name for c in policy.node_classes]
    for i in _duplicates(class_names):
        out.append((("nodeClasses", i, "name"), f"duplicate node class name {class_names[i]!r}"))
    profile_names = [p.name for p in policy.profiles]
    for i in _duplicates(profile_names):
        out.append((("profiles", i, "name"), f"duplicate profile name {profile_names[i]!r}"))
    known = set(class_names)
    for i, p in enumerate(policy.profiles):
        for j, name in enumerate(p.node_classes):
            if name not in known:
                known_list = ", ".join(class_names)
                out.append((("profiles", i, "nodeClasses", j), f"no node class {name!r} (known: {known_list})"))
        for name in p.overrides:
            if name not in known:
                out.append((("profiles", i, "overrides", name), f"no node class {name!r}"))
        classes = [c for c in policy.node_classes if not p.node_classes or c.name in p.node_classes]
        if not classes:
            continue
        if all(p.parallelism.gpus > c.gpu.count for c in classes):
            most = max(c.gpu.count for c in classes)
            out.append((("profiles", i, "parallelism"),
                        f"needs {p.parallelism.gpus} GPUs per replica (tensor x pipeline) but no node class "
                        f"it may run on has more than {most}"))
        if p.weights.cache == "required" and all(
            p.weights.bytes > c.nvme.capacity - c.nvme.reserve for c in classes
        ):
            out.append((("profiles", i, "weights", "bytes"),
                        "weights cache is required but the weights are larger than the usable NVMe "
                        "of every node class this profile may run on"))
    for j, name in enumerate(policy.warming.keep_warm):
        if name not in profile_names:
            out.append((("warming", "keepWarm", j), f"no profile {name!r}"))
    return out


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and fully check a policy document; raises :class:`PolicyError` with every problem."""
    try:
        data, lines = compose(text, source)
    except DocumentError as exc:
        raise PolicyError(exc.problems) from exc
    if not isinstance(data, dict):
        raise PolicyError([Problem(source, 1 if data is not None else None, "",
                                   "a policy must be a mapping with apiVersion, kind, nodeClasses and profiles")])
    policy = validate(Policy, data, lines, source, error=PolicyError)
    problems = [Problem(source, line_of(lines, loc), format_path(loc), msg) for loc, msg in cross_check(policy)]
    if problems:
        raise PolicyError(sorted(problems, key=lambda p: (p.line or 0, p.path)))
    return policy

