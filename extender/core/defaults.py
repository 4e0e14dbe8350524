"""Default figures for every bandwidth and phase, each with the source it comes from.

A policy overrides any of these per node class or per profile; these are what a field left out
means. The sources (field reports and upstream issues) are summarised in ``docs/sources.md``.
Units are SI base units: bytes, bytes per second, seconds.
"""

from __future__ import annotations

GB = 10**9
GiB = 2**30
MiB = 2**20

#: Local NVMe read bandwidth. HyperPod model-caching report (docs/sources.md): weights
#: cached on local NVMe are read "typically at about 7 GB/s".
NVME_READ_BPS = 7 * GB

#: NIC bandwidth of a node whose class does not say. EKS model-loading report (docs/sources.md):
#: "The NIC is rated at 40 Gbps" (g5.12xlarge), the smallest NIC in the field reports, so unknown
#: nodes are never optimistic.
NIC_BPS = 40 * GB / 8

#: What one serial object-store connection delivers. EKS model-loading report: submitting byte
#: ranges one at a time on one connection "achieved 5.96 Gbps" (g5.12xlarge, same binary and object).
OBJECT_STORE_STREAM_BPS = 5.96 * GB / 8

#: Container image pull (download + unpack). HyperPod model-caching report: a vLLM image takes
#: 5-7 min to pull cold; modelplaneai/modelplane#341: a vLLM image is about 10 GB compressed.
#: 10 GB / 6 min ~ 28 MB/s.
IMAGE_PULL_BPS = 28 * 10**6

#: torch.compile from scratch and from a local cache. EKS model-loading report: "~53s" cold for the
#: 64 GiB model; "The second pod on the same node loads those artifacts in 4s".
COMPILE_COLD_S = 53.0
COMPILE_WARM_S = 4.0

#: Size of the compile artifacts. EKS model-loading report: "writes ~15 MiB of artifacts to NVMe".
COMPILE_ARTIFACT_BYTES = 15 * MiB

#: CUDA graph capture. vllm-project/vllm#20264 (a startup log with the compile cache reused):
#: "CUDA graph capture 17 s".
GRAPH_CAPTURE_S = 17.0

#: Engine initialisation outside the phases above (process start, CUDA context, KV-cache
#: allocation, warm-up). vllm-project/vllm#20264 (same log): "engine init 34 s".
ENGINE_INIT_S = 34.0

#: Image size when a profile does not say. modelplaneai/modelplane#341: a vLLM image is about 10 GB
#: compressed (docs/sources.md).
IMAGE_BYTES = 10 * GB

#: Seconds for an engine to load one LoRA adapter whose files are on the node into GPU memory. An
#: assumption, not a measurement (a rank-16 adapter of an 8B model is tens of MB): set
#: ``lora.load`` from your engine's logs.
ADAPTER_LOAD_S = 1.0

#: Safetensors shard size used to guess a shard count. EKS model-loading report: "the ~3.9 GiB shard
#: size"; "most SafeTensors shards are 3-5 GiB".
SHARD_BYTES = int(3.9 * GiB)

#: Loader worker concurrency when a profile does not say. vLLM's Run:ai Model Streamer page names
#: the streamer's `concurrency` tunable but not its default; 16 is our recollection of it,
#: unverified here, so profiles should state the value they run with.
LOADER_CONCURRENCY = 16

#: HPA sync period and the scaler tick. docs/kubernetes-interfaces.md section 4.3: sync period 15s.
TICK_S = 15.0
