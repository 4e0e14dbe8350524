"""Default figures for every bandwidth and phase, each with the source it comes from.

A policy overrides any of these per node class or per profile; these are what a field left out
means. Seed documents are in ``shared/seeds/``; the anchors are ``shared/reference/anchors.md``.
Units are SI base units: bytes, bytes per second, seconds.
"""

from __future__ import annotations

GB = 10**9
GiB = 2**30
MiB = 2**20

#: Local NVMe read bandwidth. 004_c1beb2c0b95a55a4.txt (SageMaker HyperPod model caching): weights
#: cached on local NVMe are read "typically at about 7 GB/s".
NVME_READ_BPS = 7 * GB

#: NIC bandwidth of a node whose class does not say. 000_50d9940bc719df97.txt: "The NIC is rated
#: at 40 Gbps" (g5.12xlarge), the smallest NIC in the seeds, so unknown nodes are never optimistic.
NIC_BPS = 40 * GB / 8

#: What one serial object-store connection delivers. 000_50d9940bc719df97.txt: submitting byte
#: ranges one at a time on one connection "achieved 5.96 Gbps" (g5.12xlarge, same binary and object).
OBJECT_STORE_STREAM_BPS = 5.96 * GB / 8

#: Container image pull (download + unpack). 004_c1beb2c0b95a55a4.txt: a vLLM image takes 5-7 min to
#: pull cold; anchors.md section 1.1: a vLLM image is about 10 GB compressed. 10 GB / 6 min ~ 28 MB/s.
IMAGE_PULL_BPS = 28 * 10**6

#: torch.compile from scratch and from a local cache. 000_50d9940bc719df97.txt: "~53s" cold for the
#: 64 GiB model; "The second pod on the same node loads those artifacts in 4s".
COMPILE_COLD_S = 53.0
COMPILE_WARM_S = 4.0

#: Size of the compile artifacts. 000_50d9940bc719df97.txt: "writes ~15 MiB of artifacts to NVMe".
COMPILE_ARTIFACT_BYTES = 15 * MiB

#: CUDA graph capture. anchors.md section 12 (vllm-project/vllm#20264): "CUDA graph capture 17 s".
GRAPH_CAPTURE_S = 17.0

#: Engine initialisation outside the phases above (process start, CUDA context, KV-cache
#: allocation, warm-up). anchors.md section 12 (vllm-project/vllm#20264): "engine init 34 s".
ENGINE_INIT_S = 34.0

#: Image size when a profile does not say. anchors.md section 1.1: "a vLLM image is about 10 GB
#: compressed" (modelplaneai/modelplane#341).
IMAGE_BYTES = 10 * GB

#: Safetensors shard size used to guess a shard count. 000_50d9940bc719df97.txt: "the ~3.9 GiB shard
#: size"; "most SafeTensors shards are 3-5 GiB".
SHARD_BYTES = int(3.9 * GiB)

#: Loader worker concurrency when a profile does not say. anchors.md section 12 names Run:ai Model
#: Streamer's `concurrency` tunable but not its default; 16 is our recollection of it, unverified
#: here, so profiles should state the value they run with.
LOADER_CONCURRENCY = 16

#: HPA sync period and the scaler tick. protocols.md section 4.3: sync period 15s.
TICK_S = 15.0
