"""A tiny TCP proxy on 127.0.0.1 that tests can stop and start, to simulate a database
server going away (every connection reset, new ones refused) and coming back on the
same port, without touching the real server other tests share.

Invariants: the proxy only ever listens on loopback; ``stop()`` returns only after the
listener and every proxied connection are closed; ``start()`` reuses the same port.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` with one thread per direction."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and reset every open one (like a server crash)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            open_sockets, self._sockets = self._sockets, set()
        for sock in open_sockets:
            # SO_LINGER 0: close sends RST, as a crashed server's kernel would.
            # SUBTLE: close() alone does not end the connection while a pump thread is
            # blocked in recv() on the socket: the kernel socket lives on until that call
            # returns, sends nothing, and then swallows what the client sends, so the
            # client waits forever for an answer (a hung ingest in this suite, about one
            # outage in ten). shutdown() wakes the blocked recv() first.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
                self.connections += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
