"""What every long-running process exports about itself: build info, process metrics, and a small
``/metrics`` + ``/healthz`` + ``/readyz`` HTTP endpoint for the processes that serve nothing else
(``agent``, ``sync``, ``keda-scaler``); and, for the two servers an HPA reads the scaler's decisions
through (the External Metrics API, the KEDA scaler), how old the decision each workload is served
is (:mod:`extender.telemetry.served`). The metric names of every process are listed in docs/monitoring.md.

Importing this package does no work.
"""
