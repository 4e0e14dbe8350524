"""The container runtime's CRI image service, as the node agent calls it (``extender agent --cri-socket``).

``api.proto`` is the part of Kubernetes' Container Runtime Interface (package ``runtime.v1``) that
lists images, trimmed from k8s.io/cri-api; ``api_pb2*.py`` are generated from it by
``scripts/generate-grpc-stubs``. Besides :mod:`extender.keda`, the only package that imports grpc.
"""
