"""A TCP proxy between Allotment and its database that can fail on purpose.

Faults a test can cause, on the real protocol (MySQL or PostgreSQL), with
the real driver and database on either side:

* :meth:`FaultProxy.down` -- every connection is cut and new ones are
  refused, as when the database host is unreachable; :meth:`up` ends it;
* :meth:`FaultProxy.cut_at_commit` -- the next ``COMMIT`` a client sends is
  either passed on and its answer withheld (the database commits, the
  client never hears so) or withheld itself (nothing is committed), and the
  connection is cut: from the client's side the two cannot be told apart.

Bounded: it listens on 127.0.0.1 only, and stops with :meth:`close`.
"""

from __future__ import annotations

import select
import socket
import threading

#: What a client's COMMIT looks like on the wire: a MySQL COM_QUERY packet
#: (3-byte length, sequence number, 0x03, the text), or a PostgreSQL simple
#: query message ("Q", 4-byte length, the text, NUL).
_MYSQL_COMMIT = bytes([7, 0, 0, 0, 3]) + b"COMMIT"
_PG_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


def is_commit(data: bytes) -> bool:
    return data in (_MYSQL_COMMIT, _PG_COMMIT)


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._down = False
        #: "deliver" (the database commits) or "withhold" (it does not).
        self._commit_fault: str | None = None
        self.cut_commits: list[str] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def url(self, url: str) -> str:
        """``url`` (a SQLAlchemy URL of the upstream) pointed at this proxy."""
        import sqlalchemy as sa

        return sa.engine.make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    # -- faults ---------------------------------------------------------------
    def down(self) -> None:
        with self._lock:
            self._down = True
            pairs = list(self._pairs)
        for pair in pairs:
            self._close(pair)

    def up(self) -> None:
        with self._lock:
            self._down = False

    def cut_at_commit(self, how: str) -> None:
        """Cut the connection of the next COMMIT; ``how``: ``deliver`` or ``withhold``."""
        assert how in ("deliver", "withhold")
        with self._lock:
            self._commit_fault = how

    # -- plumbing -------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = (client, server)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair: tuple[socket.socket, socket.socket]) -> None:
        client, server = pair
        try:
            while True:
                readable, _, _ = select.select([client, server], [], [], 1.0)
                if self._closed:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if is_commit(data) and self._take_commit_fault(data, pair):
                            return
                        server.sendall(data)
                    else:
                        client.sendall(data)
        except (OSError, ValueError):
            # ValueError: the pair was cut (closed) by another thread while
            # this one waited in select, whose socket is then fd -1.
            return
        finally:
            self._close(pair)

    def _take_commit_fault(self, data: bytes, pair) -> bool:
        with self._lock:
            how, self._commit_fault = self._commit_fault, None
        if how is None:
            return False
        client, server = pair
        if how == "deliver":
            server.sendall(data)
            server.settimeout(10)
            try:
                server.recv(65536)  # the database's answer: committed; the client never sees it
            except OSError:
                pass
        self.cut_commits.append(how)
        return True

    def _close(self, pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()
