"""Cellsight's HTTP API: the Nova-compatible server list, query v2, health.

``cellsight.api.app.create_app(settings, *, engine=None, registry=None) -> FastAPI`` builds the
app. Routers take everything they need from ``request.app.state``; nothing is global.

What ``app.state`` holds (the contract other routers rely on):

``settings``
    The ``cellsight.settings.Settings`` the app was built with.
``registry``
    ``cellsight.cells.mappings.CellRegistry``: cells, instance mappings, cell engines (cell
    engines carry the per-statement timeout ``settings.cell_timeout``).
``engine``
    The ``cellsight.indexer.engines.base.SearchEngine`` (the configured one is an
    ``cellsight.api.index_probe.DeferredEngine``: until the background prober could build it,
    every call raises ``EngineUnavailable``). Do not call it directly for reads that
    have a cell fallback: go through ``search`` so the safe-connect flag applies.
``resources``
    A ``contextlib.ExitStack`` the app's lifespan closes at shutdown: what a router opens
    on first use and keeps (the reservations' notifier) is entered on it.
``prober``
    ``cellsight.api.index_probe.IndexProber``: connects and probes the index in the background
    (started by the app's lifespan; while it runs, requests never probe).
``metrics``
    ``cellsight.api.metrics.ApiMetrics``: this app's Prometheus registry (``/metrics``); count
    bugs a fall-back hid with ``metrics.bug(where, exc, log)``.
``authenticator``
    ``cellsight.api.auth.Authenticator``. Routes take the caller with the FastAPI dependency
    ``cellsight.api.auth.current_principal`` (``principal: Principal =
    Depends(current_principal)``); ``Principal`` has ``user_id``, ``project_id``,
    ``roles`` and ``is_admin``. Missing/unknown tokens raise 401 before the route runs.
``safe_connect``
    ``cellsight.api.safe_connect.SafeConnect``: ``use_index() -> bool``, ``failed(exc)``,
    ``succeeded()``, ``status() -> dict`` (what ``/healthz`` shows).
``fanout``
    ``cellsight.api.fanout.FanOut``: the thread pool over cells. ``map_cells(cells, fn)`` runs
    ``fn(cell, sa_connection)`` in every cell concurrently under the per-cell deadline
    and returns ``CellResults(results: dict[cell_uuid, T], skipped: list[SkippedCell])``;
    ``search(request, cells)`` is the merge-sorted instance listing.
``search``
    ``cellsight.api.paths.InstanceSearch``: ``search(request: SearchRequest, principal, *,
    project=None, prefer_index=True) -> Page``. Scopes the request (a non-admin to their
    own project whatever ``project`` says; an admin to ``project`` when given), picks the
    index or the fan-out path (safe-connect flag, synced marker), falls back to the cells
    on an index failure. ``Page`` has ``documents: list[dict]`` (instance documents in the
    request's total order, the same on both paths), ``path: "index" | "fanout"``,
    ``reason`` and ``skipped: list[SkippedCell]``. ``marker_values(uuid, order,
    principal)`` gives a marker's sort values (a 400, the same for an unknown marker and
    one the caller may not see); ``cells_for(project)`` the cells worth asking;
    ``status()`` what ``/healthz`` shows.

Errors: raise the subclasses of ``cellsight.api.errors.ApiError`` (a failing database:
``cellsight.api.errors.unavailable(what, exc)``, which logs the driver text under the request
id and answers a 503 naming only the id) (``BadRequest(message,
parameter=...)``, ``Forbidden``, ``NotFound``, ``Unauthorized``); one handler turns
them into Nova's body shape ``{"badRequest": {"code": 400, "message": ...}}``. Any
other exception becomes a logged 500 with the same shape and the request id, never a
traceback. Every answer carries ``x-openstack-request-id``.
Responses that skipped cells carry ``X-Cellsight-Skipped-Cells`` (``cellsight.api.headers``).
"""
