"""agl's dashboard: runs, rollouts, span trees, training curves, resources and failures in the browser.

Server-rendered HTML over any store, read-only; ``agl dashboard --store URL`` serves it alone and ``agl server``
serves it at ``/``. Jinja2 is imported only when a page is first rendered.
"""

from agl.dashboard.app import PAGE_ROUTES, add_dashboard, create_dashboard_app

__all__ = ["PAGE_ROUTES", "add_dashboard", "create_dashboard_app"]
