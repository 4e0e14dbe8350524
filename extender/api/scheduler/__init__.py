"""The scheduler extender's HTTP server: Flask app factory, scheduler verbs, its settings and metrics.

Importing this package does no work and imports neither Flask nor prometheus_client (the launcher
must configure prometheus_client's multiprocess mode first); import
:func:`extender.api.scheduler.app.create_app` and :class:`extender.api.scheduler.settings.Settings` directly.
"""
