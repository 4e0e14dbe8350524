"""The small one-class policy the warm planner and warmer tests share: 8-GPU nodes, 1 TB NVMe, and
an ``llm`` profile with a compile key. Each test module appends its own profiles and sections."""

from __future__ import annotations

DIGEST = "sha256:" + "a" * 64
#: ``llm``'s compile-key inputs (camelCase, as in a policy file).
KEY_INPUTS = {"modelId": "m/llm", "revision": "v1", "imageDigest": DIGEST, "engineVersion": "1",
              "torchVersion": "2", "tritonVersion": "3", "cudaVersion": "12"}
LLM_IMAGE = "example.com/llm:1"

#: Ends inside ``profiles:`` so that a module can add profiles, then its own top-level sections.
GPU_LLM_POLICY = f"""
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: gpu
    matchLabels: {{pool: gpu}}
    gpu: {{product: TEST-GPU, count: 8}}
    nvme: {{capacity: 1000GB, readBandwidth: 20GB/s, reserve: 100GB}}
    network: {{nic: 100Gbps, objectStorePerStream: 8Gbps, imagePull: 100MB/s}}
profiles:
  - name: llm
    match: {{labels: {{app: llm}}}}
    image: {{reference: "{LLM_IMAGE}", size: 10GB}}
    weights: {{source: "s3://models/llm/", version: v1, bytes: 100GB, shardFiles: 10, loaderConcurrency: 10}}
    parallelism: {{tensor: 8}}
    compile: {{cold: 100s, warm: 10s, artifactBytes: 1GB, key: {KEY_INPUTS}}}
    graphCapture: 10s
    engineInit: 20s
"""
