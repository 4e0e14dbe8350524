"""The simulator: replay demand on a simulated cluster through the production estimator, scorer,
scaler and warmer, and compare strategies (``extender simulate``; docs/simulator.md).

Modules, one concept each: ``scenario`` (the file), ``traces`` and ``synthetic`` (demand),
``kubescheduler`` and ``hpa`` (the stock Kubernetes baselines), ``cluster`` (nodes, pods, caches),
``queueing`` (the FIFO queue and delays), ``strategies`` (the named combinations), ``simulation``
(the loop), ``report``, ``plots`` and ``progress`` (output), ``commands`` (the CLI edge).
"""
