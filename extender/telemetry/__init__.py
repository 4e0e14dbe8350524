"""What every long-running process exports about itself: build info, process metrics, and a small
``/metrics`` + ``/healthz`` + ``/readyz`` HTTP endpoint for the processes that serve nothing else
(``agent``, ``sync``, ``keda-scaler``). The metric names of every process are listed in docs/monitoring.md.

Importing this package does no work.
"""
