"""A TCP forwarder whose connections a test can cut at any moment (``drop_all``).

For fault tests of a database client: point the client at ``proxy.port``
instead of the server's, then ``drop_all()`` closes every forwarded
connection on both sides at once, as a network cut or a restarted load
balancer would, while new connections keep being accepted.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["DroppingProxy"]


class DroppingProxy:
    """Forward ``127.0.0.1:port`` to ``target``; ``drop_all`` cuts every open connection.

    Args:
        target: ``(host, port)`` of the server.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        """The port clients connect to."""
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.dropped = 0
        """How many connections ``drop_all`` has cut."""
        self.accepted = 0
        """How many client connections it accepted (forwarded or, target down, closed)."""
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def drop_all(self) -> int:
        """Cut every forwarded connection now (both sides); return how many pairs."""
        with self._lock:
            victims, self._open = self._open, []
        for s in victims:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.dropped += len(victims) // 2
        return len(victims) // 2

    def close(self) -> None:
        """Stop accepting and cut what is open."""
        self._closed = True
        self._listener.close()
        self.drop_all()
