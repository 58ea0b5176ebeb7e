"""A hostile OpenAI-compatible server that echoes the request's ``Authorization`` header everywhere.

    python tests/echo_auth_server.py        # prints "listening PORT" once ready, serves until killed

Every other completion is a 401 whose error body holds the header; the rest stream it as their
text. ``/metrics``, ``/health`` and ``/version`` echo it too; ``GET /seen`` says how many
``/metrics`` requests came with and without one (``{"metrics_with_auth": N, "metrics_without": M}``).
Binds 127.0.0.1 only. For issue 23 point 5 (tests/test_credentials_redacted.py).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_count = itertools.count()
_seen = {"metrics_with_auth": 0, "metrics_without": 0}
_lock = threading.Lock()


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # close-delimited bodies: the stream ends when the connection does

    def _auth(self) -> str:
        return self.headers.get("Authorization", "")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Echo-Auth", self._auth())
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0]
        if path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "echo", "owned_by": self._auth()}]}).encode())
        elif path == "/metrics":
            with _lock:
                _seen["metrics_with_auth" if self._auth() else "metrics_without"] += 1
            self._send(200, f"# auth {self._auth()}\nvllm:num_requests_running 0\n".encode(),
                       "text/plain; version=0.0.4")
        elif path == "/seen":
            with _lock:
                self._send(200, json.dumps(_seen).encode())
        else:
            self._send(200, json.dumps({"status": "ok", "you_sent": self._auth()}).encode())

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        auth = self._auth()
        if next(_count) % 2:
            self._send(401, json.dumps({"error": {"message": f"invalid key: {auth}", "type": "auth",
                                                  "code": 401}}).encode())
            return
        chat = self.path.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(max(1, int(body.get("max_tokens") or 4))):
            choice = {"index": 0, "delta": {"content": f"echo {auth} "}, "finish_reason": None} if chat else \
                {"index": 0, "text": f"echo {auth} ", "finish_reason": None}
            self.wfile.write(f"data: {json.dumps({'id': 'e', 'model': 'echo', 'choices': [choice]})}\n\n".encode())
            self.wfile.flush()
        last = {"index": 0, "delta": {}, "finish_reason": "length"} if chat \
            else {"index": 0, "text": "", "finish_reason": "length"}
        self.wfile.write(f"data: {json.dumps({'id': 'e', 'model': 'echo', 'choices': [last]})}\n\n"
                         "data: [DONE]\n\n".encode())

    def log_message(self, *_: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
