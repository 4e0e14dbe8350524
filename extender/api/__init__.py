"""The HTTP APIs, each a Flask app run by gunicorn (:mod:`extender.api.launcher`, :mod:`extender.api.asgi`).

* :mod:`extender.api.scheduler`: the kube-scheduler extender (``/filter``, ``/prioritize``,
  ``/explain``), served by ``extender serve``;
* :mod:`extender.api.external_metrics`: the External Metrics API the stock HPA reads the scaler's
  decisions through, served inside ``extender scale``.

Importing this package does no work and imports neither Flask nor prometheus_client.
"""
