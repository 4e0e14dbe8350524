"""The scheduler extender's HTTP server: Flask app factory, scheduler verbs, gunicorn launcher.

Importing this package does no work and imports neither Flask nor prometheus_client (the launcher
must configure prometheus_client's multiprocess mode first); import
:func:`extender.server.app.create_app` and :class:`extender.server.settings.Settings` directly.
"""
