"""The ``--metrics-port`` endpoint: prometheus-client's handler on a server with budgets.

``prometheus_client.start_http_server`` starts a thread per connection with no socket timeout, so
half-open connections (2,000 were held) pile up threads for as long as their peers like. Here a
connection gets ``TIMEOUT_S`` per read and ``DEADLINE_S`` in all, and at most ``MAX_CONNECTIONS``
are served at once; the next is answered 503 and closed by the accepting thread.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

__all__ = ["DEADLINE_S", "MAX_CONNECTIONS", "TIMEOUT_S", "serve_metrics"]

TIMEOUT_S = 5.0
DEADLINE_S = 10.0
MAX_CONNECTIONS = 32
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Handler(MetricsHandler):
    timeout = TIMEOUT_S  # StreamRequestHandler: the socket's timeout, per read and write

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[_Handler], cap: int) -> None:
        self._slots = threading.BoundedSemaphore(cap)
        self._started: dict[Any, float] = {}  # connection being served -> when it was accepted
        self._lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(address, handler)

    def cut_late(self) -> None:
        """Every second, end the connections served for more than ``DEADLINE_S`` (a slow drip that
        keeps each read under ``TIMEOUT_S``): one thread for all, not a timer per connection."""
        while not self._closed.wait(1.0):
            now = time.monotonic()
            with self._lock:
                late = [c for c, t in self._started.items() if now - t > DEADLINE_S]
            for conn in late:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a peer that went away or was cut: nothing to report

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(0.5)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._started[request] = time.monotonic()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._started.pop(request, None)
            self._slots.release()


def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                  cap: int = MAX_CONNECTIONS) -> tuple[_Server, threading.Thread]:
    """Serve ``registry`` at ``/metrics`` on ``host:port`` from a daemon thread; raises ``OSError``."""
    handler = type("StreamchaosMetricsHandler", (_Handler,), {"registry": registry})
    server = _Server((host, port), handler, cap)
    thread = threading.Thread(target=server.serve_forever, name="streamchaos-metrics", daemon=True)
    thread.start()
    threading.Thread(target=server.cut_late, name="streamchaos-metrics-deadline", daemon=True).start()
    return server, thread
