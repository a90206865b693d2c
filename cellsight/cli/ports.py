"""Whether the API can listen where it is told to, checked before anything starts.

``cellsight api`` and ``cellsight demo`` call ``check_api_bind`` first: uvicorn only finds
out once the app has started, logs several lines and exits 3, which is this CLI's
lock-held code.
"""

from __future__ import annotations

import errno
import socket

import typer

from cellsight.cli.context import fail, setting_of, settings_of
from cellsight.cli.errors import USAGE

# A port another process holds, or one below 1024 without the privilege: the port is at
# fault. Anything else (an address not of this machine, a name that does not resolve,
# an IPv6 address without IPv6) is the host's.
_PORT_ERRORS = {errno.EADDRINUSE: "is not free", errno.EACCES: "needs a privilege to bind"}


def check_bind(
    host: str,
    port: int,
    *,
    host_option: str = "--host",
    port_option: str = "--port",
    choose: str | None = None,
) -> None:
    """Exit with one usage line (2: the option's value is unusable here) naming
    ``port_option`` or ``host_option`` when ``host:port`` cannot be bound, and how to
    ``choose`` another port (default: another ``port_option``). Port 0 (any free port)
    checks the host only."""
    # As uvicorn binds: IPv6 for an address with a colon, SO_REUSEADDR (so a port left
    # in TIME_WAIT by a previous run counts as free, and a listening one does not).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except socket.gaierror as exc:
        fail(f"{host_option} {host}: not an address or a name that resolves ({exc.strerror})")
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in _PORT_ERRORS:
            fail(
                f"{port_option} {port}: {host}:{port} {_PORT_ERRORS[exc.errno]} ({why}); "
                f"choose another {choose or port_option}",
                code=USAGE,
            )
        fail(f"{host_option} {host}: cannot listen on it ({why})", code=USAGE)


def serve_metrics(port: int, label: str = "metrics_port (CELLSIGHT_METRICS_PORT)") -> None:
    """The Prometheus endpoint on ``port`` (0: any free one); a port that cannot be bound
    is ``ConfigError`` naming the setting as ``label`` (one usage line, exit 2, from any
    process)."""
    from cellsight.indexer import metrics
    from cellsight.settings import ConfigError

    try:
        metrics.serve(port)
    except OSError as exc:
        why = _PORT_ERRORS.get(exc.errno or 0, "cannot be listened on")
        raise ConfigError(f"{label} {port} {why} ({exc.strerror or exc}); choose another") from None


def check_api_bind(ctx: typer.Context, host: str | None, port: int | None, bind: int) -> str:
    """``check_bind`` for the API's address, each part named as the operator gave it:
    ``host`` and ``port`` the options given (None: from the settings), ``bind`` the port
    to check. Returns the host to bind."""
    settings = settings_of(ctx)
    defaulted = port is None and "api_port" not in settings.model_fields_set
    bind_host = host or settings.api_host
    check_bind(
        bind_host,
        bind,
        host_option="--host" if host else setting_of(ctx, "api_host"),
        port_option="--port" if port is not None else setting_of(ctx, "api_port"),
        # A default is changed where the operator would set it, not "another default".
        choose="with --port or CELLSIGHT_API_PORT" if defaulted else None,
    )
    return bind_host
