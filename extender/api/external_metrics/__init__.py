"""The External Metrics API (``external.metrics.k8s.io/v1beta1``): the app, its authentication, label selectors.

Importing this package does no work; import :mod:`extender.api.external_metrics.app` directly.
"""
