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
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from extender.core import defaults
from extender.core.cachekey import CompileKeyInputs
from extender.core.document import Loc, compose, format_path, line_of, validate
from extender.core.errors import DocumentError, InvalidValueError, PolicyError, Problem, UnknownNameError
from extender.core.images import check_reference
from extender.core.k8snames import (
    DnsLabel,
    DnsSubdomain,
    LabelValue,
    QualifiedName,
    env_names,
    optional_qualified_name,
    qualified_name_problem,
)
from extender.core.schema import Float, Int, Schema, Text, plain_number
from extender.core.shell import heredoc_at, script_positions
from extender.core.units import QUANTITY_PATTERN, Bandwidth, Bytes, format_duration, parse_quantity
from extender.core.units import Duration as AnyDuration

API_VERSION = "extender.io/v1alpha1"

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value) or len(value) > 63:
        raise InvalidValueError(
            f"{value!r} is not a valid name: lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return value


Name = Annotated[str, AfterValidator(_name)]

# Values the warmer hands to the team's templates and that end up in paths and command lines.
# Templates never let a shell parse them (extender.warm.templates), but a value that is no URI or
# version at all is a typo or an attack either way: refuse it where a person can see it.
# Unicode on purpose: every script's space is refused (the template would split there), and a
# non-ASCII letter is a URI's to hold (an S3 or GCS object key is any UTF-8).
_REFERENCE = re.compile(r"[^\s'\"\\`$;|&<>(){}*?\[\]!#~-][^\s'\"\\`$;|&<>(){}*?\[\]!#~]*", re.UNICODE)
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def _reference(value: str) -> str:
    if value and (not _REFERENCE.fullmatch(value) or len(value) > 1024 or not value.isprintable()):
        raise InvalidValueError(
            f"{value!r} is not a URI or image reference: no spaces, quotes, shell characters "
            "($ ; | & < > ( ) { } * ? [ ] ! # ~ `) or leading '-', at most 1024 characters"
        )
    return value


def _version(value: str) -> str:
    if not _VERSION.fullmatch(value) or len(value) > 128:
        raise InvalidValueError(
            f"{value!r} is not a valid version: letters, digits, '.', '_', '+' and '-', starting "
            "with a letter or digit, at most 128 characters (it names a directory on every node)"
        )
    return value


#: Longest duration a policy field takes: a year. Longer is a typo, and Kubernetes keeps a Job's
#: ``ttlSecondsAfterFinished`` in 32 bits.
MAX_DURATION_S = 365 * 86_400.0


def _within_a_year(seconds: float) -> float:
    if seconds > MAX_DURATION_S:
        raise InvalidValueError(f"{format_duration(seconds)} is longer than {format_duration(MAX_DURATION_S)}, "
                                "the longest duration a policy takes")
    return seconds


#: A duration in a policy (:data:`extender.core.units.Duration`), at most :data:`MAX_DURATION_S`.
Duration = Annotated[AnyDuration, AfterValidator(_within_a_year)]
Reference = Annotated[str, AfterValidator(_reference)]
def _host_path(value: str) -> str:
    parts = value.split("/")
    if not value.startswith("/") or ".." in parts or "\0" in value or len(value) > 4096:
        raise InvalidValueError(
            f"{value!r} is not a host path Kubernetes takes: absolute, no '..' component, at most 4096 characters")
    return value


#: An absolute path on the node for a ``hostPath`` volume (the API server refuses a '..' component).
HostPath = Annotated[str, AfterValidator(_host_path), Field(json_schema_extra={"pattern": "^/"})]
#: A container image reference kubelet can pull (:func:`extender.core.images.check_reference`).
ImageReference = Annotated[str, AfterValidator(check_reference), Field(json_schema_extra={"minLength": 1})]
Version = Annotated[str, AfterValidator(_version)]
PositiveBandwidth = Annotated[Bandwidth, Field(gt=0)]
PositiveBytes = Annotated[Bytes, Field(gt=0)]


# ---------------------------------------------------------------------------------------------
# Node classes
# ---------------------------------------------------------------------------------------------


class Gpu(Schema):
    """The accelerators of a node class."""

    product: str = Field(min_length=1, description="as in the nvidia.com/gpu.product label")
    #: GPUs per node of this class.
    count: Int = Field(ge=1, le=64)


class Nvme(Schema):
    """Local NVMe used as the node's cache root. ``capacity: 0`` means the class has none."""

    #: Size of the cache filesystem; 0: the class has no local NVMe.
    capacity: Bytes
    #: Sequential read speed of the NVMe (loading cached weights, restoring snapshots).
    read_bandwidth: PositiveBandwidth = defaults.NVME_READ_BPS
    #: Space the warmer and the scorer never plan to fill (room for logs, images, scratch).
    reserve: Bytes = 0

    @model_validator(mode="after")
    def _reserve_fits(self) -> Nvme:
        if self.reserve > self.capacity:
            raise InvalidValueError("reserve is larger than capacity")
        return self


class Network(Schema):
    """What the node can pull, and how fast."""

    #: The node's network bandwidth, shared by every download to it.
    nic: PositiveBandwidth = defaults.NIC_BPS
    #: What one serial object-store stream gets (one per shard file being read).
    object_store_per_stream: PositiveBandwidth = defaults.OBJECT_STORE_STREAM_BPS
    #: Effective speed of a container image pull (download and unpack).
    image_pull: PositiveBandwidth = defaults.IMAGE_PULL_BPS


class NodeClass(Schema):
    """A kind of node, recognised by its labels (all must match)."""

    #: The class's name (profiles and overrides refer to it; ``unknown`` is reserved for nodes no class matches).
    name: Name
    #: Node labels that identify the class; a node must carry all of them. The first class that
    #: matches a node is its class, so a class whose labels include all of an earlier class's can
    #: never match and is an error: list the more specific class first.
    match_labels: dict[QualifiedName, LabelValue] = Field(min_length=1)
    gpu: Gpu
    nvme: Nvme
    network: Network = Network()
    #: Nodes of this class the cluster can hold in all: the node pool's maximum (cluster-autoscaler
    #: ``--nodes`` max, Karpenter ``limits``), counting those that exist. The scaler shares capacity
    #: only when every class a workload may use has one (extender.core.sharing); unset: unbounded.
    max_nodes: Annotated[int, Field(ge=0, le=100_000), BeforeValidator(plain_number)] | None = None

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

    #: Pod labels that must all be present with these values. Keys and values follow Kubernetes'
    #: label syntax: the scaler lists pods with them as a label selector, and a value no label can
    #: hold (``a,b`` would read as two requirements there) could never match a pod.
    labels: dict[QualifiedName, LabelValue] = {}
    #: Pod annotations that must all be present with these values (keys are qualified names).
    annotations: dict[QualifiedName, str] = {}

    @model_validator(mode="after")
    def _not_empty(self) -> PodMatch:
        if not self.labels and not self.annotations:
            raise InvalidValueError("give at least one label or annotation, or every pod would match")
        return self

    def matches(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        """True when the pod carries every listed label and annotation."""
        return all(labels.get(k) == v for k, v in self.labels.items()) and all(
            annotations.get(k) == v for k, v in self.annotations.items()
        )


class Image(Schema):
    """The serving container image."""

    #: Image reference as in the pod spec (kubelet's image list is matched against it).
    reference: ImageReference
    #: Bytes pulled when the image is not on the node.
    size: PositiveBytes = defaults.IMAGE_BYTES


WeightsCache = Literal["required", "preferred", "none"]


class Weights(Schema):
    """Model weights: where they live and how the loader reads them.

    ``cache`` says what the profile expects of node NVMe: ``required`` (the weights must be cached
    locally; a class whose NVMe cannot hold them is unusable), ``preferred`` (cache when there is
    room), ``none`` (always stream from the source).
    """

    source: Annotated[Reference, Field(min_length=1, description="URI: s3://, gs://, hf://, file://, ...")]
    #: Revision of the weights; names their directory on every node's cache.
    version: Version
    #: Total size of the weight files.
    bytes: PositiveBytes
    shard_files: Int = Field(default=0, ge=0, description="0: derived from bytes and a 3.9 GiB shard")
    #: Files the loader reads in parallel (its worker count).
    loader_concurrency: Int = Field(default=defaults.LOADER_CONCURRENCY, ge=1)
    #: Per-stream object-store throughput this loader configuration achieves, when it differs from
    #: the node class's (EKS model-loading report, docs/sources.md: chunk size changes what one
    #: worker gets).
    stream_bandwidth: PositiveBandwidth | None = None
    #: required, preferred or none: what the profile expects of node NVMe (see above).
    cache: WeightsCache = "preferred"

    @property
    def shards(self) -> int:
        """Shard files, derived from the size when not given (at least one)."""
        return self.shard_files or max(1, -(-self.bytes // defaults.SHARD_BYTES))

    @property
    def cached(self) -> bool:
        """Does the profile keep its weights on node NVMe (``cache`` is not ``none``)?"""
        return self.cache != "none"

    @property
    def streams(self) -> int:
        """Parallel object-store streams: one serial stream per file, capped by the loader's workers."""
        return min(self.shards, self.loader_concurrency)


class Parallelism(Schema):
    """Tensor and pipeline parallel degree (GPUs per replica = tensor x pipeline)."""

    #: Tensor-parallel degree.
    tensor: Int = Field(default=1, ge=1)
    #: Pipeline-parallel degree.
    pipeline: Int = Field(default=1, ge=1)

    @property
    def gpus(self) -> int:
        """GPUs one replica occupies."""
        return self.tensor * self.pipeline


class Compile(Schema):
    """torch.compile: seconds from scratch, seconds from a cache on the node, artifact size, key."""

    #: Compile time from scratch.
    cold: Duration = defaults.COMPILE_COLD_S
    #: Compile time with this key's cache on the node.
    warm: Duration = defaults.COMPILE_WARM_S
    #: Size of the compile cache (fetched from the registry, stored on NVMe).
    artifact_bytes: Bytes = defaults.COMPILE_ARTIFACT_BYTES
    #: Inputs of the compile-cache key (extender cachekey); unset: the cache is never shared.
    key: CompileKeyInputs | None = None

    @model_validator(mode="after")
    def _warm_not_slower(self) -> Compile:
        if self.warm > self.cold:
            raise InvalidValueError("warm (from cache) is slower than cold (from scratch)")
        return self


class Snapshot(Schema):
    """A process snapshot (e.g. CRIU + cuda-checkpoint) restorable on nodes of one class."""

    #: Size of the snapshot read from NVMe to restore.
    bytes: PositiveBytes
    #: Time to restore the process once the snapshot is read.
    restore: Duration


class Adapter(Schema):
    """One LoRA adapter of a workload (a tenant's fine-tune of the base model)."""

    #: The adapter's name in requests (vLLM's ``--lora-modules NAME=PATH``); unique in the profile.
    name: Name
    #: Where its files are fetched from (the warmer's adapter template gets it as {{source}}).
    source: Annotated[Reference, Field(min_length=1, description="URI: s3://, gs://, hf://, file://, ...")]
    #: Size of its files.
    bytes: PositiveBytes


class Lora(Schema):
    """LoRA adapters served on top of the base model.

    ``adapters`` are listed most popular first; a replica loads the first ``preload`` of them at
    start (vLLM ``--lora-modules``, SGLang ``--lora-paths``) and is Ready once they are loaded, so
    they are part of its startup; the others load on a tenant's first request. ``load`` is the
    engine's seconds to load one adapter into GPU memory once its files are on the node.
    """

    #: The adapters, most popular first.
    adapters: tuple[Adapter, ...] = Field(min_length=1)
    #: How many of the first adapters a replica loads before it is Ready.
    preload: Int = Field(default=1, ge=0)
    #: Engine seconds to load one adapter whose files are on the node (an assumption by default).
    load: Duration = defaults.ADAPTER_LOAD_S

    @model_validator(mode="after")
    def _unique_names(self) -> Lora:
        names = [a.name for a in self.adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidValueError(f"adapter names must be unique; repeated: {', '.join(twice)}")
        return self


class Capacity(Schema):
    """What one ready replica serves, in the unit the demand signal is measured in."""

    #: Demand one ready replica serves within the SLO, in unit.
    per_replica: Float = Field(gt=0)
    #: Unit of the demand signal and of perReplica.
    unit: Literal["requests/s", "tokens/s"] = "requests/s"


#: Signal sources the predictive scaler knows (registry: extender.scaler.signals.SOURCES).
SignalSourceName = Literal["scrape", "prometheus"]
#: Serving engines whose metric names the scaler knows (registry: extender.scaler.exposition.ENGINES).
EngineName = Literal["vllm", "sglang"]


def _file_path(value: str) -> str:
    if not value.startswith("/") or "\0" in value or not value.isprintable():
        raise InvalidValueError(
            f"{value!r} is not an absolute path: the scaler reads the file at run time, from its own "
            "filesystem (a mounted Secret, e.g. /var/run/secrets/prometheus/token)"
        )
    return value


#: A file the scaler reads at run time (a secret, a certificate): an absolute path, never the content.
FilePath = Annotated[str, AfterValidator(_file_path)]

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Headers the client sets itself, or that carry credentials (which have their own fields).
_RESERVED_HEADERS = {"authorization": "give bearerTokenFile or basicAuth instead",
                     "proxy-authorization": "credentials are never written in the policy",
                     "cookie": "credentials are never written in the policy",
                     "host": "it is taken from the url", "content-length": "the client sets it",
                     "connection": "the client sets it", "transfer-encoding": "the client sets it"}


def _no_inline_secret(data: object, field: str, use: str) -> None:
    if isinstance(data, dict) and field in data:
        raise InvalidValueError(
            f"{field}: secrets are not written in the policy (it is not a Secret and is printed by "
            f"'extender policy show'); put it in a file, mount it, and give {use}"
        )


class BasicAuth(Schema):
    """HTTP basic authentication: the user name, and the file that holds the password."""

    username: str = Field(min_length=1, description="user name sent to Prometheus")
    password_file: FilePath = Field(description="file holding the password (surrounding whitespace is dropped); "
                                                "re-read when it changes")

    @model_validator(mode="before")
    @classmethod
    def _password_not_inline(cls, data: object) -> object:
        _no_inline_secret(data, "password", "passwordFile")
        return data

    @model_validator(mode="after")
    def _username_is_a_user(self) -> BasicAuth:
        if ":" in self.username or not self.username.isprintable():
            raise InvalidValueError(f"username {self.username!r}: no ':' and no control characters (basic auth "
                                    "joins user and password with ':')")
        return self


class ClientTls(Schema):
    """TLS towards an ``https://`` Prometheus: the CA to trust and the client certificate to present."""

    ca_file: FilePath | None = Field(default=None, description="CA bundle (PEM) that signed the server's "
                                                               "certificate (default: the system's CAs)")
    cert_file: FilePath | None = Field(default=None, description="client certificate (PEM); needs keyFile")
    key_file: FilePath | None = Field(default=None, description="private key of certFile (PEM)")

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ClientTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidValueError("certFile and keyFile go together")
        return self


class PrometheusSignal(Schema):
    """Where the ``prometheus`` signal source asks, and what.

    ``query`` must evaluate to the demand rate in the profile's ``capacity.unit``; ``queueQuery`` to
    the queue depth in the matching amount. Unset, both are built from the engine's metric names,
    restricted by ``selector`` (PromQL label matchers without braces, e.g.
    ``namespace="llm",pod=~"qwen-.*"``) and averaged over ``rateWindow``.

    A managed or shared Prometheus asks who is calling: ``bearerTokenFile`` or ``basicAuth``, a
    ``tls`` section for its CA and a client certificate, and ``headers`` such as a tenant
    (``X-Scope-OrgID`` for Cortex, Mimir and Thanos). Secrets live in files (mounted Secrets) that
    the scaler re-reads when they change; the policy holds only their paths.
    """

    url: str = Field(min_length=1, description="base URL of the Prometheus HTTP API, e.g. http://prometheus:9090")
    query: str | None = Field(default=None, min_length=1,
                              description="PromQL for the demand rate (default: built from the engine's metrics)")
    queue_query: str | None = Field(default=None, min_length=1,
                                    description="PromQL for the queue depth (default: built from the engine's metrics)")
    selector: str = Field(default="", description="label matchers added to the default queries, without braces")
    rate_window: Annotated[Duration, Field(gt=0)] = Field(default=60.0, description="range of rate() in the "
                                                                                    "default queries")
    timeout: Annotated[Duration, Field(gt=0)] = Field(default=5.0, description="time limit of one query")
    bearer_token_file: FilePath | None = Field(default=None, description="file holding a bearer token, sent as "
                                                                         "'Authorization: Bearer'; re-read when "
                                                                         "it changes")
    basic_auth: BasicAuth | None = None
    tls: ClientTls | None = None
    headers: dict[str, str] = Field(default={}, description="extra request headers, e.g. X-Scope-OrgID: tenant-a")
    backfill: bool = Field(default=True, description="when the workload's stored history is shorter than the "
                                                    "store keeps or has holes, fill them from the queries' past "
                                                    "(range queries), so a new or restarted scaler forecasts "
                                                    "from days of demand at once")

    @model_validator(mode="before")
    @classmethod
    def _token_not_inline(cls, data: object) -> object:
        _no_inline_secret(data, "bearerToken", "bearerTokenFile")
        return data

    @model_validator(mode="after")
    def _coherent(self) -> PrometheusSignal:
        scheme, sep, rest = self.url.partition("://")
        if not sep or scheme not in ("http", "https") or not rest.strip("/"):
            raise InvalidValueError(f"url {self.url!r}: expected http://HOST[:PORT][/PATH] or https://...")
        if "@" in rest.split("/", 1)[0]:
            raise InvalidValueError("url: credentials in the URL are not allowed (the policy is no Secret); "
                                    "give basicAuth with a passwordFile")
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise InvalidValueError("bearerTokenFile and basicAuth exclude each other: one Authorization header")
        if self.tls is not None and scheme != "https":
            raise InvalidValueError("tls applies to an https:// url only")
        for name, value in self.headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise InvalidValueError(f"headers: {name!r} is not a header name")
            if name.lower() in _RESERVED_HEADERS:
                raise InvalidValueError(f"headers: {name} is not allowed here: {_RESERVED_HEADERS[name.lower()]}")
            if not value.isprintable():
                raise InvalidValueError(f"headers: the value of {name} has control characters")
        return self


class Signal(Schema):
    """Where a workload's demand comes from (the scaler's signal source, selected by name).

    ``scrape``: the workload's pods (found through the Kubernetes API with the profile's ``match``)
    are scraped at ``<scheme>://<podIP>:<port><path>``; ``prometheus``: a PromQL query. The rate is
    in the profile's ``capacity.unit``; ``rateMetrics`` / ``queueMetrics`` override the engine's
    counter and gauge names (counters are summed over every series and pod, then turned into a rate).
    """

    #: scrape: the pods' /metrics; prometheus: PromQL queries (section prometheus).
    source: SignalSourceName = "scrape"
    #: Serving engine, whose metric names the default queries and scrapes use.
    engine: EngineName = "vllm"
    #: Port of the pods' metrics endpoint (scrape).
    port: Int = Field(default=8000, ge=1, le=65535)
    #: Path of the pods' metrics endpoint (scrape).
    path: str = Field(default="/metrics", pattern=r"^/")
    #: Scheme of the pods' metrics endpoint (scrape).
    scheme: Literal["http", "https"] = "http"
    #: Time limit of one scrape.
    timeout: Annotated[Duration, Field(gt=0)] = 2.0
    #: Counter names whose summed rate is the demand (default: the engine's).
    rate_metrics: tuple[str, ...] = ()
    #: Gauge names whose sum is the queue (default: the engine's waiting requests).
    queue_metrics: tuple[str, ...] = ()
    prometheus: PrometheusSignal | None = None

    @model_validator(mode="after")
    def _prometheus_needs_its_section(self) -> Signal:
        if self.source == "prometheus" and self.prometheus is None:
            raise InvalidValueError("source 'prometheus' needs a prometheus section with at least a url")
        return self


class ReplicaBounds(Schema):
    """``minReplicas`` <= ``maxReplicas``: shared by the scaler's policy section and the simulator's
    workloads, so both refuse an empty range with the same words."""

    #: Fewest replicas the scaler asks for.
    min_replicas: Int = Field(default=1, ge=0)
    #: Most replicas the scaler asks for.
    max_replicas: Int = Field(ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaBounds:
        if self.min_replicas > self.max_replicas:
            raise InvalidValueError(f"minReplicas {self.min_replicas} is larger than maxReplicas {self.max_replicas}")
        return self


class Autoscaling(ReplicaBounds):
    """The predictive scaler's view of one workload: where its pods run, replica bounds, its signal.

    ``namespace``: where the workload's pods (and its HPA) live; unset, pods matching the profile in
    any namespace count. The desired replica count is kept within ``[minReplicas, maxReplicas]``
    (give the HPA the same bounds).
    """

    #: Namespace of the workload's pods and HPA; unset: any namespace.
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    signal: Signal = Signal()


class PhaseOverride(Schema):
    """Phase times for one node class, where they differ (a B200 compiles faster than an H200).

    The three bandwidths replace the class's for this profile only: what this workload's image pull,
    object-store streams and NVMe reads achieve there. ``extender.core.calibration`` writes all of
    these fields when it applies a fit; a team may write them by hand too.
    """

    #: Replaces compile.cold on this class.
    compile_cold: Duration | None = None
    #: Replaces compile.warm on this class.
    compile_warm: Duration | None = None
    #: Replaces graphCapture on this class.
    graph_capture: Duration | None = None
    #: Replaces engineInit on this class.
    engine_init: Duration | None = None
    #: Replaces snapshot.restore on this class.
    snapshot_restore: Duration | None = None
    #: Image pull bandwidth of this profile on the class (replaces ``network.imagePull``).
    image_pull: PositiveBandwidth | None = None
    #: What one object-store stream of this profile's loader gets on the class (replaces
    #: ``weights.streamBandwidth`` and ``network.objectStorePerStream``).
    stream_bandwidth: PositiveBandwidth | None = None
    #: NVMe read bandwidth this profile's loader gets on the class (replaces ``nvme.readBandwidth``).
    nvme_read: PositiveBandwidth | None = None


class FilterRules(Schema):
    """Hard rules, all off by default: warmth should raise a score, not exclude a node."""

    #: Filter out nodes whose free NVMe cannot hold the weights (opt-in hard rule).
    require_nvme_fit: bool = False
    #: Filter out nodes where the estimated startup exceeds startupSlo (opt-in hard rule).
    require_startup_within_slo: bool = False


#: The most of an engine's log the sync reads: 64 MiB.
MAX_ENGINE_LOG_BYTES = 64 * 1024 * 1024


class EngineLog(Schema):
    """Read the phase times the engine logs as it starts (extender.core.enginelog) into each observed start.

    Only with ``calibration.mode`` other than ``off``. When a replica turns Ready, ``extender sync``
    reads the first ``limitBytes`` of this container's log (the API server's ``pods/log``; the chart
    grants it only with ``sync.readEngineLogs``) and stores the phases it finds with the start.
    A log that cannot be read leaves the start recorded without them (docs/calibration.md).
    """

    #: The engine's container in the workload's pods (the vLLM or SGLang server's).
    container: DnsLabel
    #: The most of the log read, from its beginning (the startup lines come first).
    limit_bytes: Bytes = Field(default=1024 * 1024, ge=4096, le=MAX_ENGINE_LOG_BYTES)


class Profile(Schema):
    """A workload: how to recognise its pods and everything that decides how fast they start."""

    #: The workload's name (labels of published metrics, warm Jobs, inventory keys).
    name: Name
    #: The pods of this workload. A pod belongs to the first profile that matches it, so a profile
    #: whose match includes all of an earlier profile's can never match and is an error.
    match: PodMatch
    node_classes: tuple[str, ...] = Field(default=(), description="classes it may run on; empty: any")
    image: Image
    weights: Weights
    parallelism: Parallelism = Parallelism()
    compile: Compile = Compile()
    #: CUDA graph capture time (not cached).
    graph_capture: Duration = defaults.GRAPH_CAPTURE_S
    #: Engine start time besides loading, compiling and capturing.
    engine_init: Duration = defaults.ENGINE_INIT_S
    snapshot: Snapshot | None = None
    #: LoRA adapters served on the base model; the preloaded ones are part of startup.
    lora: Lora | None = None
    capacity: Capacity | None = None
    #: Startup time the workload should meet (reports; the opt-in filter rule).
    startup_slo: Annotated[Duration, Field(gt=0)] | None = None
    overrides: dict[str, PhaseOverride] = {}
    filter: FilterRules = FilterRules()
    #: The predictive scaler's settings for this workload; unset: ``extender scale`` leaves it alone.
    autoscaling: Autoscaling | None = None
    #: Share of a fleet too small for every workload's desired replicas (extender.core.sharing):
    #: higher goes first within each round; every observed load is served before any forecast.
    priority: Int = Field(default=0, ge=0, le=1000)
    #: Calibration reads the phase times this workload's engine logs (opt-in: logs may hold secrets,
    #: and reading them needs the ``pods/log`` grant); unset: starts are fitted from their totals.
    engine_log: EngineLog | None = None

    @model_validator(mode="after")
    def _slo_rule_needs_slo(self) -> Profile:
        if self.filter.require_startup_within_slo and self.startup_slo is None:
            raise InvalidValueError("filter.requireStartupWithinSlo is set but startupSlo is not")
        return self

    def matches(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        """True when a pod with these labels and annotations belongs to this workload."""
        return self.match.matches(labels, annotations)

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """Every LoRA adapter of the workload (none without a ``lora`` section)."""
        return self.lora.adapters if self.lora is not None else ()

    @property
    def preloaded_adapters(self) -> tuple[Adapter, ...]:
        """The adapters a replica loads before it is Ready: the first ``lora.preload``."""
        return self.lora.adapters[: self.lora.preload] if self.lora is not None else ()


# ---------------------------------------------------------------------------------------------
# Knobs for the extender, the scaler and the warmer
# ---------------------------------------------------------------------------------------------


class Scoring(Schema):
    """How estimated seconds become the extender's 0..10 score."""

    #: Seconds saved worth one point (absolute, so one point means the same on every request).
    seconds_per_point: Annotated[Duration, Field(gt=0)] = 30.0
    #: Points taken off a node whose free NVMe cannot hold the weights without eviction.
    nvme_pressure_penalty: Int = Field(default=2, ge=0, le=10)
    #: Points at most for GPU bin-packing: ``round(packingPoints x fill)`` where ``fill`` is the
    #: share of the node's GPUs in use with the pod on it (extender.core.scoring). 0: off.
    packing_points: Int = Field(default=0, ge=0, le=10)
    #: Points at most taken off a node for the warm replica slots a pod would take from larger
    #: profiles: ``round(protectWarmPoints x min(lost / G, 1))``, ``lost`` the GPUs of those slots
    #: and ``G`` the node's (extender.core.scoring). 0: off.
    protect_warm_points: Int = Field(default=0, ge=0, le=10)


class Scaling(Schema):
    """The predictive scaler: its loop, the forecaster (extender.core.forecast) and the decision
    (extender.core.scaler)."""

    #: Time between the scaler's decisions.
    tick: Annotated[Duration, Field(gt=0)] = defaults.TICK_S
    #: How late the HPA acts on a published value (its sync period), added to the horizon.
    hpa_sync_delay: Duration = defaults.TICK_S
    #: ``auto`` chooses among the others per workload by held-out error at the horizon needed.
    forecaster: Literal["auto", "last", "ewma", "holt", "holt-winters"] = "auto"
    #: Scale down only to the highest recommendation of this window (as the HPA does).
    scale_down_stabilisation: Duration = 300.0
    #: Upper quantile of forecast demand that capacity is sized for (AHPA's template: 95).
    quantile: Float = Field(default=0.95, gt=0.5, lt=1)
    #: Fit the smoothing constants to each workload's history, once per ``refit``, from the last
    #: ``fitWindow`` of it; see extender.core.forecast.ForecastParams.
    fit: bool = True
    #: How often the constants are fitted again (fit); each workload at its own moment of the
    #: period, from a hash of its name, so that the refits do not all land in one tick.
    refit: Annotated[Duration, Field(gt=0)] = 3600.0
    #: How much recent history a fit uses (fit).
    fit_window: Annotated[Duration, Field(gt=0)] = 66 * 3600.0
    #: Fixed smoothing of level, trend and daily season, and trend damping (1: none): used when
    #: ``fit`` is off or the history is too short to fit.
    alpha: Float = Field(default=0.3, gt=0, le=1)
    #: Fixed smoothing of the trend (see alpha).
    beta: Float = Field(default=0.05, ge=0, le=1)
    #: Fixed smoothing of the daily season (see alpha).
    gamma: Float = Field(default=0.2, ge=0, le=1)
    #: Trend damping, 1: none (see alpha).
    phi: Float = Field(default=1.0, gt=0, le=1)
    #: Season of Holt-Winters (a day) and the forecast grid step (unset: the history's own spacing).
    season: Annotated[Duration, Field(gt=0)] = 86_400.0
    #: Forecast grid step; unset: the history's own spacing.
    step: Annotated[Duration, Field(gt=0)] | None = None
    #: Seconds within which the reactive need drains the current queue.
    queue_drain: Annotated[Duration, Field(gt=0)] = 60.0
    #: Share of a replica's capacity the scaler plans to use: every need is divided by
    #: ``capacity x targetUtilization``. Below 1 it keeps headroom for the noise within a tick (the
    #: stock HPA's target utilisation plays the same part); 1: replicas are planned at full capacity.
    target_utilization: Float = Field(default=1.0, gt=0, le=1)
    #: The HPA's tolerance (docs/kubernetes-interfaces.md section 4.3); the decision mirrors it to say what will happen.
    tolerance: Float = Field(default=0.1, ge=0, lt=1)
    #: How long the node autoscaler takes to bring a new node to Ready for a pending pod (its
    #: median; 0: a fixed fleet). Added to the horizon when no node has room for the next replica,
    #: and to the cache warmer's look-ahead (extender.core.warming.look_ahead).
    provision_delay: Annotated[Duration, Field(ge=0)] = 0.0


CalibrationMode = Literal["off", "suggest", "apply"]


class FactorBounds(Schema):
    """How far a fitted phase may move from the policy's: factors of its seconds (2: twice as slow).

    The policy's own value (factor 1) must be inside: calibration corrects a policy, it may not be
    forbidden to agree with it.
    """

    #: Smallest factor (0.25: the fitted phase takes at least a quarter of the policy's seconds).
    min: Float = Field(default=0.25, gt=0)
    #: Largest factor (4: at most four times the policy's seconds).
    max: Float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _contains_one(self) -> FactorBounds:
        if not self.min <= 1.0 <= self.max:
            raise InvalidValueError(f"min {self.min:g} and max {self.max:g} must enclose 1 (the policy's own value)")
        return self


class CalibrationBounds(Schema):
    """Bounds per fitted parameter (names in extender.core.calibration.PARAMETERS); ``default`` for the rest."""

    #: Bounds of every parameter not listed below.
    default: FactorBounds = FactorBounds()
    #: Seconds per byte of a missing image (the image pull bandwidth).
    image_pull: FactorBounds | None = None
    #: Seconds per byte of weights streamed from the object store (its effective bandwidth).
    weights_remote: FactorBounds | None = None
    #: Seconds per byte of weights read from the node's NVMe.
    weights_local: FactorBounds | None = None
    #: torch.compile from scratch.
    compile_cold: FactorBounds | None = None
    #: torch.compile from a cache on the node (or fetched from the registry).
    compile_warm: FactorBounds | None = None
    #: CUDA graph capture.
    graph_capture: FactorBounds | None = None
    #: Engine init besides loading, compiling and capturing.
    engine_init: FactorBounds | None = None
    #: Both graphCapture and engineInit, where either has no bounds of its own (they were one factor).
    engine: FactorBounds | None = None
    #: Process snapshot restore.
    snapshot_restore: FactorBounds | None = None
    #: A node's factor on its whole estimated startup against its peers (per-node calibration).
    node: FactorBounds | None = None

    def of(self, field_name: str) -> FactorBounds:
        """The bounds of one parameter by its snake_case field name (``engine``'s for graph capture and engine init)."""
        own: FactorBounds | None = getattr(self, field_name)
        if own is None and field_name in ("graph_capture", "engine_init"):
            own = self.engine
        return own if own is not None else self.default


class Calibration(Schema):
    """Learning the startup phases from the replicas the cluster starts (extender.core.calibration).

    ``off``: nothing is observed. ``suggest``: ``extender sync`` records each new replica's start
    and ``extender estimate --calibrated`` / ``extender calibrate show`` show the fit; nothing else
    changes. ``apply``: the extender's scores, the scaler's horizon and the warmer's plans use the
    fitted values. docs/calibration.md has the estimator, its assumptions and what it cannot learn.
    """

    #: ``off``: nothing observed; ``suggest``: observed and shown; ``apply``: used by every component.
    mode: CalibrationMode = "off"
    #: How many observed starts the policy's value of a phase weighs (each in the cache state where
    #: that phase is largest): the larger, the more observations it takes to move it.
    prior_observations: Float = Field(default=3.0, gt=0, le=10_000)
    #: Fits of fewer observations are shown but never applied.
    min_observations: Int = Field(default=3, ge=1)
    #: Observations kept per (workload, node class), the newest.
    window: Int = Field(default=200, ge=1, le=10_000)
    #: Observations older than this are dropped.
    max_age: Annotated[Duration, Field(gt=0)] = 7 * 86_400.0
    #: A start is observed only if the node's inventory record was within this (and its TTL) of the
    #: sync's clock, either way, when the pod was scheduled: older news may not be what the pod found,
    #: and a heartbeat stamped further ahead comes from a clock that cannot be trusted.
    max_inventory_age: Annotated[Duration, Field(gt=0)] = 60.0
    #: The sync must see the new pod within this of its PodScheduled time (else it may have changed
    #: the node's caches before they were read).
    capture_within: Annotated[Duration, Field(gt=0)] = 15.0
    #: How far a fit may move each parameter from the policy's value, as factors of its seconds.
    bounds: CalibrationBounds = CalibrationBounds()

    @model_validator(mode="after")
    def _enough_kept_to_apply(self) -> Calibration:
        if self.min_observations > self.window:
            raise InvalidValueError(f"minObservations ({self.min_observations}) is more than the window keeps "
                                    f"({self.window}): no fit could ever be applied")
        return self


#: Container resources Kubernetes knows without a domain prefix (``hugepages-<size>`` too).
_STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


class Toleration(Schema):
    """A Kubernetes toleration on the warm Jobs' pods (``key`` empty with ``Exists``: every taint).

    Checked as Kubernetes checks a pod's tolerations: a key is a qualified name, an empty key needs
    ``Exists``, ``Exists`` takes no value, an ``Equal`` value is a label value.
    """

    #: Taint key; empty with Exists: every taint.
    key: Annotated[str, AfterValidator(optional_qualified_name)] = ""
    #: Exists or Equal, as in a pod's tolerations.
    operator: Literal["Exists", "Equal"] = "Equal"
    #: Taint value (Equal).
    value: LabelValue = ""
    #: Taint effect; empty: every effect.
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    @model_validator(mode="after")
    def _as_kubernetes_takes_it(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise InvalidValueError(f"operator Exists takes no value (got value {self.value!r}): it matches every "
                                    "value of the key; use operator Equal to match one")
        if not self.key and self.operator != "Exists":
            raise InvalidValueError("an empty key matches every taint and needs operator Exists; give the taint's "
                                    "key to match one value")
        return self


def _quantity(value: Any) -> str:
    parse_quantity(value)
    return value if isinstance(value, str) else str(value)  # Kubernetes accepts `cpu: 2` and reads "2"


#: A Kubernetes resource quantity (``100m``, ``2``, ``4Gi``), checked as the API server reads it and
#: kept as written (a number becomes its text).
Quantity = Annotated[str, BeforeValidator(_quantity), WithJsonSchema({
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": QUANTITY_PATTERN}],
    "x-unit": "quantity", "examples": ["100m", "2", "4Gi"]})]


def _resource_names(resources: dict[str, str]) -> dict[str, str]:
    """Container resource names as Kubernetes takes them: a standard one (``cpu``, ``memory``,
    ``ephemeral-storage``, ``hugepages-<size>``) or an extended one with a domain (``nvidia.com/gpu``)."""
    problems: list[str] = []
    for name in resources:
        problem = qualified_name_problem(name)
        if problem is None and "/" not in name and name not in _STANDARD_RESOURCES \
                and not name.startswith("hugepages-"):
            problem = (f"{name!r} is not a container resource: cpu, memory, ephemeral-storage, hugepages-<size>, "
                       "or an extended resource with its domain (nvidia.com/gpu)")
        if problem is None and "kubernetes.io/" in name:
            problem = f"{name!r}: resources in the kubernetes.io domain are Kubernetes' own, not container resources"
        if problem is not None:
            problems.append(problem)
    if problems:  # every name at once: `policy check` lists every problem
        raise InvalidValueError("; ".join(problems))
    return resources


def _overcommit_refused(name: str) -> bool:
    return "/" in name or name.startswith("hugepages-")


class JobResources(Schema):
    """Requests and limits of every container of a warm Job, as Kubernetes quantities (``100m``, ``2Gi``).

    Limits matter: a copy tool without a memory limit can grow its buffers until the node's serving
    pods are OOM-killed, and warming must never hurt what already serves.
    """

    #: Resource requests of each container.
    requests: Annotated[dict[str, Quantity], AfterValidator(_resource_names)] = {
        "cpu": "100m", "memory": "256Mi"}
    #: Resource limits of each container.
    limits: Annotated[dict[str, Quantity], AfterValidator(_resource_names)] = {
        "cpu": "2", "memory": "4Gi"}

    @model_validator(mode="after")
    def _requests_within_limits(self) -> JobResources:
        # every offending resource in one message (one error is what a model check can raise), so
        # `policy check` lists them all rather than the first
        problems: list[str] = []
        for name in sorted(self.requests):
            if not _overcommit_refused(name):
                continue
            if self.limits.get(name) is None:
                problems.append(f"requests.{name} needs limits.{name} equal to it: Kubernetes does not "
                                "overcommit extended resources and hugepages")
            elif parse_quantity(self.requests[name]) != parse_quantity(self.limits[name]):
                problems.append(f"requests.{name} ({self.requests[name]}) differs from limits.{name} "
                                f"({self.limits[name]}): Kubernetes does not overcommit extended resources "
                                "and hugepages, they must be equal")
        for name in sorted(self.requests.keys() & self.limits.keys()):
            if _overcommit_refused(name):  # reported above: they must be equal
                continue
            if parse_quantity(self.requests[name]) > parse_quantity(self.limits[name]):
                problems.append(f"requests.{name} ({self.requests[name]}) is larger than limits.{name} "
                                f"({self.limits[name]}); Kubernetes refuses such a Job")
        if problems:
            raise InvalidValueError("; ".join(problems))
        return self


class StepTemplate(Schema):
    """One container of a warm Job, the team's own tooling: ``{{name}}`` placeholders are filled per action.

    Placeholders may appear in ``image``, ``command``, ``args`` and ``env`` values; which names each
    kind offers is in :data:`TEMPLATE_VARS` (and docs/warming.md). The values also reach the
    container as ``WARM_<NAME>`` environment variables, for scripts.
    """

    #: Container image of the step.
    image: str = Field(min_length=1)
    #: Command of the container (no shell unless you name one).
    command: tuple[str, ...] = Field(min_length=1)
    #: Arguments of the command.
    args: tuple[str, ...] = ()
    #: Environment variables of the container (names as Kubernetes takes them).
    env: Annotated[dict[str, str], AfterValidator(env_names)] = {}
    #: Secrets in the warm namespace whose keys become environment variables (object-store credentials).
    env_from_secrets: tuple[DnsSubdomain, ...] = ()


#: Placeholders every template may use.
TEMPLATE_COMMON = frozenset({"node", "nodeClass", "workload", "kind", "cacheId", "cacheRoot", "registry", "bytes"})
#: Placeholders per template (the key is the field name under ``warming.templates``).
TEMPLATE_VARS: dict[str, frozenset[str]] = {
    "weights": TEMPLATE_COMMON | {"source", "version", "staging", "dest"},
    "compile": TEMPLATE_COMMON | {"key", "staging", "dest"},
    "snapshot": TEMPLATE_COMMON | {"version", "staging", "dest"},
    "adapter": TEMPLATE_COMMON | {"source", "adapter", "staging", "dest"},
    "publishCompile": TEMPLATE_COMMON | {"key", "dir"},
}
#: ``{{ name }}`` in a template.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z][A-Za-z0-9]*)\s*\}\}", re.UNICODE)

def script_problem(script: str) -> str | None:
    """Why a shell script with ``{{placeholders}}`` cannot be rendered safely, or ``None``.

    A here-document's body is neither quoted nor unquoted text (an apostrophe in it opens nothing),
    so the quoting of the placeholders after it cannot be known: refused, with the way out.
    """
    if PLACEHOLDER.search(script) and heredoc_at(script) is not None:
        return ("a here-document (<<) in a shell script with {{placeholders}} is not supported: the quoting of "
                "the placeholders cannot be told; use printf, or put the text in a file or an env value")
    return None


class WarmTemplates(Schema):
    """The fetch step of each kind of warm Job, and the step that publishes a compile cache.

    A kind without a template is planned (a dry run shows it) but never started. Images need no
    template: the workload's own image is pulled by running it with ``imagePullCommand``.
    """

    #: Fetches a workload's weights into {{staging}}.
    weights: StepTemplate | None = None
    #: Fetches a compile cache from the registry into {{staging}}.
    compile: StepTemplate | None = None
    #: Fetches a process snapshot into {{staging}}.
    snapshot: StepTemplate | None = None
    #: Fetches one LoRA adapter ({{source}}, {{adapter}}) into {{staging}}.
    adapter: StepTemplate | None = None
    #: Uploads ``{{dir}}`` (a node's compile cache of key ``{{key}}``) to the registry.
    publish_compile: StepTemplate | None = None


class Taint(Schema):
    """The taint that keeps pods off a new node until it is warm."""

    #: Taint key (a qualified name, ``[prefix/]name``).
    key: QualifiedName = "extender.io/warming"
    #: Taint value (a label value: letters, digits, ``-``, ``_``, ``.``; may be empty).
    value: LabelValue = "true"
    #: Taint effect.
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NewNodes(Schema):
    """What happens when a node joins: keep-warm workloads are staged on it; optionally it stays tainted.

    With ``taintUntilWarm``, a node the warmer first sees younger than ``joinWindow`` gets
    ``taint`` (register nodes with it, kubelet ``--register-with-taints``, to close the window
    before the warmer sees them); the taint comes off once the node holds every keep-warm cache it
    can, or after ``maxTaint`` whatever happens: warming must never keep a node out of service.
    """

    #: Taint new nodes until they are warm (see above).
    taint_until_warm: bool = False
    #: The taint put on new nodes.
    taint: Taint = Taint()
    #: A node younger than this when first seen counts as new.
    join_window: Annotated[Duration, Field(gt=0)] = 600.0
    #: The taint comes off after this long whatever happens.
    max_taint: Annotated[Duration, Field(gt=0)] = 1800.0


class WarmRetry(Schema):
    """Retries of failed warm Jobs: after ``initial * 2**(attempt-1)`` seconds, at most ``max``."""

    #: Wait before the first retry of a failed warm Job.
    initial: Annotated[Duration, Field(gt=0)] = 30.0
    #: Longest wait between retries.
    max: Annotated[Duration, Field(gt=0)] = 1800.0
    #: Pod retries inside one Job (its ``backoffLimit``) before the Job counts as failed.
    pod_retries: Int = Field(default=1, ge=0, le=10)

    @model_validator(mode="after")
    def _initial_within_max(self) -> WarmRetry:
        if self.initial > self.max:
            raise InvalidValueError(f"initial ({format_duration(self.initial)}) is longer than max "
                                    f"({format_duration(self.max)}): every wait would be max")
        return self


class PublishedSnapshot(Schema):
    """A process snapshot of ``workload`` for ``nodeClass`` that the snapshot template can fetch."""

    #: The profile the snapshot is of.
    workload: str = Field(min_length=1)
    #: The node class it restores on.
    node_class: str = Field(min_length=1)


_DEFAULT_TOLERATIONS = (
    Toleration.model_validate({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
    Toleration.model_validate({"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
)


class Warming(Schema):
    """The cache warmer: what it may start each tick (planner: extender.core.warming). Off unless enabled.

    ``enabled`` gates the executor; the planner plans regardless, so a dry run shows what enabling
    would do.
    """

    #: Start warm Jobs (off: plan only; extender warm plan shows the plan).
    enabled: bool = False
    #: Workloads staged on every fresh node of a class they may run on, when free NVMe allows (no
    #: evictions for this), and whose current caches are never evicted by the warmer.
    keep_warm: tuple[str, ...] = ()
    #: Warm Jobs running at once on one node, counting those in flight (actions and compile publishes).
    max_concurrent_per_node: Int = Field(default=1, ge=1)
    #: Warm Jobs running at once in the cluster (see maxConcurrentPerNode).
    max_concurrent: Int = Field(default=4, ge=1)
    #: Bytes the Jobs started in one tick may move in total, actions first, then compile publishes
    #: (object store and registry egress); unset: no limit.
    bytes_per_tick: PositiveBytes | None = None
    #: A cache used more recently than this is not evicted: it is likely wanted again soon, and
    #: evicting it to warm something else only moves the cold start elsewhere.
    evict_after_idle: Duration = 600.0

    # ---- the executor: how each action becomes a Kubernetes Job (extender.warm, docs/warming.md) ----
    #: Namespace of the warm Jobs and their Events.
    namespace: DnsLabel = "extender-warm"
    #: The cache root on the nodes (a hostPath; the agent DaemonSet's path).
    host_cache_root: HostPath = "/mnt/nvme/extender-cache"
    #: Image with the ``extender`` command, for the steps around a template (evict, stage, finish);
    #: unset: the image ``extender scale --warm-helper-image`` names (the chart passes its own image).
    helper_image: ImageReference | None = None
    #: A low PriorityClass: a warm Job never preempts a serving pod, and is the first to go under pressure.
    priority_class_name: DnsSubdomain | None = "extender-warm"
    #: ServiceAccount of the Job pods (for workload identity to the object store); none by default.
    service_account_name: DnsSubdomain | None = None
    #: Tolerations of the warm Jobs' pods (default: the GPU taints).
    tolerations: tuple[Toleration, ...] = _DEFAULT_TOLERATIONS
    #: Requests and limits of every warm Job container.
    resources: JobResources = JobResources()
    #: Finished Jobs are deleted by Kubernetes after this long (the warmer deletes them sooner once
    #: the agent confirmed the result); the safety net if the warmer stops.
    #: At least 1s, and longer than ``confirmWithin``: the warmer reads a finished Job to confirm it.
    ttl_after_finished: Annotated[Duration, Field(ge=1)] = 3600.0
    #: A Job running longer than this is failed by Kubernetes (a hung copy must not hold a slot forever).
    active_deadline: Annotated[Duration, Field(ge=1)] = 7200.0
    #: Retries of failed warm Jobs.
    retry: WarmRetry = WarmRetry()
    #: A Job that succeeded but whose cache the inventory does not show after this long counts as
    #: failed (a template writing to the wrong place).
    confirm_within: Annotated[Duration, Field(gt=0)] = 300.0
    #: The command an image-pull Job runs in the workload's image (the pull is the point; it must exit 0).
    image_pull_command: tuple[str, ...] = Field(default=("true",), min_length=1)
    #: Where compile caches (and snapshots) are published and fetched: ``{{registry}}`` in templates.
    registry: Reference = ""
    #: Your fetch and publish steps, per kind of cache.
    templates: WarmTemplates = WarmTemplates()
    #: Process snapshots the snapshot template can fetch (the inventory records no snapshot registry).
    published_snapshots: tuple[PublishedSnapshot, ...] = ()
    #: A compile cache is published once it has been on a node this long (engines fill it while
    #: compiling; publishing it half-written would hand every other node a partial cache).
    publish_after: Duration = 120.0
    #: What happens when a node joins.
    new_nodes: NewNodes = NewNodes()

    @model_validator(mode="after")
    def _ttl_outlasts_confirmation(self) -> Warming:
        if self.ttl_after_finished <= self.confirm_within:
            raise InvalidValueError(
                f"ttlAfterFinished ({format_duration(self.ttl_after_finished)}) is not longer than "
                f"confirmWithin ({format_duration(self.confirm_within)}): Kubernetes would delete a "
                "succeeded Job before the warmer could confirm it, and its failures would go unreported")
        return self

    def snapshot_pairs(self) -> frozenset[tuple[str, str]]:
        """(workload, node class) of every published snapshot (``publishedSnapshots``)."""
        return frozenset((p.workload, p.node_class) for p in self.published_snapshots)


class Metadata(Schema):
    """Identification only."""

    #: The policy's name (shown in reports, so one line of printable text: no control characters).
    name: Text = ""
    #: Free text.
    description: str = ""


class Policy(Schema):
    """A whole policy file."""

    #: Always extender.io/v1alpha1.
    api_version: Literal["extender.io/v1alpha1"]
    #: Always Policy.
    kind: Literal["Policy"]
    metadata: Metadata = Metadata()
    node_classes: tuple[NodeClass, ...] = ()
    profiles: tuple[Profile, ...] = ()
    scoring: Scoring = Scoring()
    scaling: Scaling = Scaling()
    warming: Warming = Warming()
    #: Learning the startup phases from the replicas the cluster starts (docs/calibration.md).
    calibration: Calibration = Calibration()

    def node_class(self, name: str) -> NodeClass:
        """The node class called ``name``."""
        for c in self.node_classes:
            if c.name == name:
                return c
        raise UnknownNameError(f"no node class {name!r} (known: {', '.join(c.name for c in self.node_classes)})")

    @property
    def profile_names(self) -> frozenset[str]:
        """Names of every workload profile."""
        return frozenset(p.name for p in self.profiles)

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

    def classes_hosting(self, profile: Profile) -> tuple[NodeClass, ...]:
        """The classes of :meth:`classes_for` whose nodes have the GPUs of one replica (tensor x
        pipeline); all of them when none has (the policy check reports that)."""
        classes = self.classes_for(profile)
        return tuple(c for c in classes if c.gpu.count >= profile.parallelism.gpus) or classes

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
    for i, name in enumerate(class_names):
        if name == UNKNOWN_CLASS.name:
            out.append((("nodeClasses", i, "name"),
                        f"{name!r} is reserved: it names the class of nodes that match no class (cold, no "
                        "NVMe, scored 0), and nodes of a class so named would be taken for those; rename it"))
    profile_names = [p.name for p in policy.profiles]
    for i in _duplicates(profile_names):
        out.append((("profiles", i, "name"), f"duplicate profile name {profile_names[i]!r}"))
    known = set(class_names)
    for i, p in enumerate(policy.profiles):
        for j, name in enumerate(p.node_classes):
            if name not in known:
                known_list = ", ".join(class_names)
                out.append((("profiles", i, "nodeClasses", j), f"no node class {name!r} (known: {known_list})"))
        for name, o in p.overrides.items():
            cold = p.compile.cold if o.compile_cold is None else o.compile_cold
            warm = p.compile.warm if o.compile_warm is None else o.compile_warm
            if warm > cold:
                out.append((("profiles", i, "overrides", name),
                            f"compile warm ({format_duration(warm)}, from cache) is slower than compile cold "
                            f"({format_duration(cold)}, from scratch) on this class"))
            if name not in known:
                out.append((("profiles", i, "overrides", name), f"no node class {name!r}"))
            elif p.node_classes and name not in p.node_classes:
                out.append((("profiles", i, "overrides", name),
                            f"node class {name!r} is not one this profile may run on (nodeClasses: "
                            f"{', '.join(p.node_classes)}): the override would never apply"))
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
    for i, p in enumerate(policy.profiles):
        pinned = p.image.reference.partition("@")[2]
        if pinned and p.compile.key is not None and p.compile.key.image_digest != pinned:
            out.append((("profiles", i, "compile", "key", "imageDigest"),
                        f"{p.compile.key.image_digest} is not the digest image.reference pins ({pinned}): a node "
                        "holding either would count as holding the image, and the compile cache would be keyed "
                        "to an image the pods do not run"))
        if p.filter.require_nvme_fit and not p.weights.cached:
            out.append((("profiles", i, "filter", "requireNvmeFit"),
                        "filter.requireNvmeFit is set but weights.cache is none: the weights are streamed, never "
                        "kept on NVMe, so the rule would only turn nodes away"))
        if p.autoscaling is not None and p.capacity is None:
            out.append((("profiles", i, "autoscaling"),
                        "autoscaling needs capacity (perReplica and unit) to turn demand into replicas"))
    out.extend(_shadowed(policy))
    for j, name in enumerate(policy.warming.keep_warm):
        if name not in profile_names:
            out.append((("warming", "keepWarm", j), f"no profile {name!r}"))
    out.extend(_check_warming(policy, profile_names, known))
    return out


def _shadowed(policy: Policy) -> list[tuple[Loc, str]]:
    """Node classes and profiles that can never be chosen: the first match wins
    (:meth:`Policy.classify_node`, :meth:`Policy.profile_for_pod`), so an entry is dead when an
    earlier one asks for a subset of what it asks for (``A <= B``: every node or pod B matches, A
    matches first). A repeated name is reported as a duplicate already, not again here."""
    out: list[tuple[Loc, str]] = []
    classes = policy.node_classes
    for j, later in enumerate(classes):
        first = next((c for c in classes[:j] if c.match_labels.items() <= later.match_labels.items()), None)
        if first is not None and all(c.name != later.name for c in classes[:j]):
            out.append((("nodeClasses", j, "matchLabels"),
                        f"node class {later.name!r} can never match a node: {first.name!r} comes first and matches "
                        "every node it does (its matchLabels are a subset of these); put the more specific class "
                        "first or tell them apart by a label"))
    profiles = policy.profiles
    for j, profile in enumerate(profiles):
        earlier = next((p for p in profiles[:j] if p.match.labels.items() <= profile.match.labels.items()
                        and p.match.annotations.items() <= profile.match.annotations.items()), None)
        if earlier is not None and all(p.name != profile.name for p in profiles[:j]):
            out.append((("profiles", j, "match"),
                        f"profile {profile.name!r} can never match a pod: {earlier.name!r} comes first and matches "
                        "every pod it does (its labels and annotations are a subset of these); put the more "
                        "specific profile first"))
    return out


def _check_warming(policy: Policy, profile_names: list[str], class_names: set[str]) -> list[tuple[Loc, str]]:
    """Unknown template placeholders, and published snapshots naming what does not exist."""
    out: list[tuple[Loc, str]] = []
    warming = policy.warming
    for field_name, template in warming.templates:
        if template is None:
            continue
        alias = "publishCompile" if field_name == "publish_compile" else field_name
        allowed = TEMPLATE_VARS[alias]
        texts: list[tuple[Loc, str]] = [(("image",), template.image)]
        texts += [(("command", i), t) for i, t in enumerate(template.command)]
        texts += [(("args", i), t) for i, t in enumerate(template.args)]
        texts += [(("env", k), v) for k, v in template.env.items()]
        argv = [*template.command, *template.args]
        for i in script_positions(argv):
            problem = script_problem(argv[i])
            if problem is not None:
                where = ("command", i) if i < len(template.command) else ("args", i - len(template.command))
                out.append((("warming", "templates", alias, *where), problem))
        for loc, text in texts:
            unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - allowed)
            if unknown:
                out.append((("warming", "templates", alias, *loc),
                            f"unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"))
            elif "{{" in PLACEHOLDER.sub("", text):
                out.append((("warming", "templates", alias, *loc), "a '{{' that is not a {{name}} placeholder"))
    for i, ref in enumerate(warming.published_snapshots):
        if ref.workload not in profile_names:
            out.append((("warming", "publishedSnapshots", i, "workload"), f"no profile {ref.workload!r}"))
        elif policy.profile(ref.workload).snapshot is None:
            out.append((("warming", "publishedSnapshots", i, "workload"),
                        f"profile {ref.workload!r} declares no snapshot"))
        if ref.node_class not in class_names:
            out.append((("warming", "publishedSnapshots", i, "nodeClass"), f"no node class {ref.node_class!r}"))
        # by name, not through classes_for: a profile's own unknown class is reported at its
        # nodeClasses, and looking it up here raised instead of adding this file's problems
        elif ref.workload in profile_names and ref.node_class not in (
                policy.profile(ref.workload).node_classes or class_names):
            out.append((("warming", "publishedSnapshots", i, "nodeClass"),
                        f"profile {ref.workload!r} does not run on node class {ref.node_class!r} (its nodeClasses)"))
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

