"""A small OTLP/HTTP receiver for the tests: ``python otlp_receiver.py OUT.jsonl`` listens on 127.0.0.1 (an
ephemeral port, printed on its first line), decodes each ``POST /v1/traces`` and ``/v1/metrics``
(``application/x-protobuf``) with the OTLP protobufs, appends it to OUT.jsonl as one JSON line
``{"path": ..., "body": MessageToDict(...)}`` and answers 200 with an empty Export*ServiceResponse. It runs
until it is terminated."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS: dict[str, tuple[Any, Any]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}
MAX_BODY = 64 << 20


def serve(out_path: str) -> None:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            kind = KINDS.get(self.path)
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(min(length, MAX_BODY))
            if kind is None or self.headers.get("content-type") != "application/x-protobuf":
                self.send_error(404 if kind is None else 415)
                return
            request, response = kind
            message = request()
            message.ParseFromString(body)
            line = json.dumps({"path": self.path, "body": MessageToDict(message)})
            with lock, open(out_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            payload = response().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1])
