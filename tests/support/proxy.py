"""A TCP proxy a test can cut (connections refused, open ones closed) and restore on the
same port, or freeze (connections accepted and kept open, nothing forwarded either
way): a real server's outage, or a server that stops answering, without touching the
server."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """127.0.0.1:port → target; ``stop`` refuses connections, ``start`` resumes;
    ``freeze`` holds every byte, ``thaw`` lets them through again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._trigger: bytes | None = None
        self._cut: bytes | None = None

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_on(self, needle: bytes) -> None:
        """Freeze once a client sends bytes holding ``needle`` (a statement's text): a
        server that stops answering after a connection is made and in use."""
        self._trigger = needle

    def cut_on(self, needle: bytes) -> None:
        """Close every open connection, once, when a client sends bytes holding
        ``needle``, before they reach the server; new connections are served: a
        failover, or an administrator's kill, under a statement."""
        self._cut = needle

    def thaw(self) -> None:
        self._trigger = None
        self._flowing.set()

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                # shutdown wakes the thread blocked in accept(); close alone may not.
                with contextlib.suppress(OSError):
                    self._server.shutdown(socket.SHUT_RDWR)
                self._server.close()
                self._server = None
            self._close_connections()
        self._flowing.set()  # held bytes meet closed sockets: their threads end

    def _close_connections(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b, asks in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, asks), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, asks: bool) -> None:
        try:
            while data := src.recv(65536):
                if asks and self._trigger is not None and self._trigger in data:
                    self._flowing.clear()
                if asks and self._cut is not None and self._cut in data:
                    self._cut = None
                    with self._lock:
                        self._close_connections()
                    return
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
