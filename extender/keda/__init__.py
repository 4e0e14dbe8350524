"""KEDA's external scaler: the predictive scaler's decision served over gRPC (``extender keda-scaler``).

For clusters where KEDA owns the ``v1beta1.external.metrics.k8s.io`` APIService, so that our
External Metrics API cannot be registered: a ScaledObject with an ``external`` (or
``external-push``) trigger pointing at this server scales on the same desired-replicas decision.
``externalscaler.proto`` is the contract (KEDA's wire format, docs/kubernetes-interfaces.md
section 7); ``externalscaler_pb2*.py`` are generated from it by ``scripts/generate-grpc-stubs``.
:mod:`~extender.keda.reading` holds the rules, :mod:`~extender.keda.service` the calls,
:mod:`~extender.keda.server` the process. Importing this package does no work.
"""
