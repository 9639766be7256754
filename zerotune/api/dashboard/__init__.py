"""The dashboard: server-rendered pages (Jinja2) with Plotly charts, served by the API under ``/dashboard``.

``routes.install(app)`` adds the pages, their two JSON aggregates and the static files (our own JS
and CSS, and plotly.js from the installed ``plotly`` package: no page makes an external request).
Page data comes from ``api.queries`` and ``api.schemas``, as the JSON API's does; the live parts poll
the JSON API. Kept free of imports.
"""
