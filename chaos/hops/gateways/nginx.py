"""`path[].kind: nginx`: Debian's nginx (or any nginx 1.19.5+: ``-e stderr``) as a streaming reverse proxy.

The shipped configuration streams: ``proxy_buffering off``, HTTP/1.1 to the upstream with the
``Connection`` header cleared, ``proxy_read_timeout`` (the longest silence between two reads from the
upstream: the idle cut of long prefill or reasoning) and ``proxy_send_timeout`` from the options.
``gzip: true`` adds what copy-paste configurations do (``gzip on; gzip_types text/event-stream;``),
and nginx then compresses as it really does; ``buffering: true`` is nginx's own default
(``proxy_buffering on``), which the upstream's ``X-Accel-Buffering: no`` turns off per response unless
``ignore_x_accel_buffering``. Measured with nginx 1.22.1 in front of the builtin stack, reads of one
64-token stream at the client (Accept-Encoding gzip / identity):

- shipped (streaming): one read per event or so (~55);
- ``gzip``: compressed, still ~57 reads (unbuffered, nginx flushes its gzip stream at each chunk);
- ``gzip`` + ``buffering`` + ``ignore_x_accel_buffering``: ONE read with gzip (the whole stream in
  one blob), ~34 without;
- ``buffering`` + ``ignore_x_accel_buffering``: still ~45 reads over HTTP/1.1 to the upstream; with
  ``http_version: "1.0"`` too, 3 reads (the response held until it ended).

``tls: true`` serves the client over TLS with the run's certificate (``listen ... ssl``); ``http2:
true`` serves HTTP/2 too (``listen ... ssl http2``, offered by ALPN beside HTTP/1.1). nginx 1.22 serves
HTTP/2 only over TLS (h2c needs ``listen ... http2`` with no ``ssl``, which then refuses HTTP/1.1 and
``Upgrade``: not what a gateway in front of browsers runs), so ``http2`` without ``tls`` is refused
where the experiment is read. The upstream side stays HTTP/1.1: ``proxy_pass`` speaks nothing else.

It runs in the foreground (``daemon off``, its pid file
and error log placed by the command line), its temporary paths under the hop's work directory; as root
its workers run as root too, since the nobody user could not write in a 0700 run directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaos.hops.gateways.base import (
    Gateway,
    GatewayOptions,
    TlsFiles,
    Upstream,
    gateway_kind,
    millis,
    quote_lines,
    run_tool,
    tls_param,
    upstream_ca,
)
from chaos.model.errors import SetupFailed
from chaos.model.params import Param

__all__ = ["Nginx"]

TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
_STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (\[\w+\]) \d+#\d+: ", re.MULTILINE)


def _h2_needs_tls(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values.get("http2") and not values.get("tls"):
        return ("http2", "nginx serves HTTP/2 only over TLS (nginx 1.22: `listen ... ssl http2`); set tls: true"
                         " too, or use caddy or haproxy for HTTP/2 in the clear (h2c)")
    return None


@gateway_kind
class Nginx(Gateway):
    """nginx in the foreground, one worker, its shipped configuration made for SSE."""

    kind = "nginx"
    binaries = ("nginx", "/usr/sbin/nginx")
    install_hint = "apt install nginx-light (Debian) or the nginx package of your system"
    config_name = "nginx.conf"
    options = GatewayOptions((
        Param("read_timeout", "duration", 300.0, min=0.001,
              doc="proxy_read_timeout: the longest silence between two reads from the upstream"),
        Param("send_timeout", "duration", 300.0, min=0.001,
              doc="proxy_send_timeout: the longest pause between two writes of the request to the upstream"),
        Param("connect_timeout", "duration", 10.0, min=0.001, max=75.0, doc="proxy_connect_timeout"),
        Param("buffering", "bool", False, doc="proxy_buffering on (nginx's default): whole responses held"),
        Param("ignore_x_accel_buffering", "bool", False,
              doc="ignore the upstream's X-Accel-Buffering header (which otherwise turns buffering off)"),
        Param("gzip", "bool", False, doc="gzip on; gzip_types text/event-stream (a common copy-paste setting)"),
        Param("http_version", "choice", "1.1", choices=("1.1", "1.0"), doc="proxy_http_version to the upstream"),
        Param("worker_connections", "int", 4096, min=16, doc="connections one worker holds (two per stream)"),
        tls_param("nginx"),
        Param("http2", "bool", False, doc="serve HTTP/2 (listen ... ssl http2; ALPN h2, HTTP/1.1 still offered);"
                                          " needs tls: nginx 1.22 serves HTTP/2 only over TLS"),
    ), checks=(_h2_needs_tls,))

    def version(self, binary: str) -> str:
        _, text = run_tool([binary, "-v"])  # "nginx version: nginx/1.22.1" on stderr
        match = re.search(r"nginx/(\S+)", text)
        return match.group(1) if match else text.splitlines()[0] if text else "unknown"

    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        o = self.effective_options(options)
        upstream = Upstream.parse(upstream_root)
        location = [*self._location(o, upstream), *self._upstream_tls(workdir, upstream)]
        user = "user root;\n" if os.geteuid() == 0 else ""
        temp = "".join(f"  {name}_temp_path {workdir / name};\n" for name in TEMP_PATHS)
        return (
            f"# streamchaos: nginx hop, shipped streaming configuration\n"
            f"{user}worker_processes 1;\n"
            f"events {{ worker_connections {o['worker_connections']}; }}\n"
            f"http {{\n  access_log off;\n{temp}"
            f"  client_max_body_size 64m;\n"
            f"  server {{\n"
            + "".join(f"    {line}\n" for line in self._listen(listen_port, workdir, o))
            + "    location / {\n"
            f"      proxy_pass {upstream.root};\n"
            + "".join(f"      {line}\n" for line in location)
            + "    }\n  }\n}\n"
        )

    @staticmethod
    def _listen(port: int, workdir: Path, o: Mapping[str, Any]) -> list[str]:
        """The server's listen line, and the run's certificate where it serves TLS."""
        refused = _h2_needs_tls(o)  # the schema refuses it; a caller that skipped the schema is told here too
        if refused is not None:
            raise SetupFailed(f"nginx: {refused[0]}: {refused[1]}")
        if not o["tls"]:
            return [f"listen 127.0.0.1:{port};"]
        files = TlsFiles.under(workdir)
        return [
            f"listen 127.0.0.1:{port} ssl{' http2' if o['http2'] else ''};",
            f"ssl_certificate {files.cert};",
            f"ssl_certificate_key {files.key};",
            "ssl_protocols TLSv1.2 TLSv1.3;",
        ]

    @staticmethod
    def _location(o: Mapping[str, Any], upstream: Upstream) -> list[str]:
        lines = [
            f"proxy_http_version {o['http_version']};",
            'proxy_set_header Connection "";',
            f"proxy_buffering {'on' if o['buffering'] else 'off'};",
            "proxy_request_buffering off;",
            f"proxy_read_timeout {millis(o['read_timeout'])};",
            f"proxy_send_timeout {millis(o['send_timeout'])};",
            f"proxy_connect_timeout {millis(o['connect_timeout'])};",
        ]
        if o["ignore_x_accel_buffering"]:
            lines.append("proxy_ignore_headers X-Accel-Buffering;")
        if o["gzip"]:
            lines.append("gzip on;")
            lines.append("gzip_types text/event-stream;")
        if upstream.scheme == "https":
            lines.append("proxy_ssl_server_name on;")
        return lines

    @staticmethod
    def _upstream_tls(workdir: Path, upstream: Upstream) -> list[str]:
        """An https upstream the run serves (its certificate): verified with the run's CA. Any other is
        not verified, as nginx's default (proxy_ssl_verify off) has it."""
        ca = upstream_ca(workdir, upstream)
        if ca is None:
            return []
        # nginx 1.22 matches DNS names only, never an IP address: the run's certificate names localhost too
        return ["proxy_ssl_verify on;", f"proxy_ssl_trusted_certificate {ca};", "proxy_ssl_name localhost;"]

    def _globals(self, workdir: Path) -> str:
        # on the command line, so a user's configuration gets them too (and is told if it sets them)
        return f"daemon off; pid {workdir / 'nginx.pid'};"

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        status, text = run_tool([binary, "-t", "-q", "-p", str(workdir), "-e", "stderr", "-c", str(config_path),
                                 "-g", self._globals(workdir)], cwd=workdir)
        if status == 0:
            return None
        # with -e stderr its lines carry a time and pid: "2026/12/04 14:40:20 [emerg] 96#96: unknown ..."
        text = _STAMP.sub(r"nginx: \1 ", text)
        return quote_lines(text, ("[emerg]", "[alert]", "[crit]"))

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "-p", str(workdir), "-e", "stderr", "-c", str(config_path), "-g", self._globals(workdir)]
