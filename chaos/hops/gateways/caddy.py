"""`path[].kind: caddy`: Debian's Caddy as a streaming reverse proxy, from a Caddyfile.

``reverse_proxy`` with ``flush_interval -1`` (every write flushed at once; Caddy does so for
``text/event-stream`` anyway), the transport's ``read_timeout`` (the longest silence from the
upstream), ``write_timeout`` and ``dial_timeout`` from the options. No admin endpoint, no automatic
HTTPS (it would listen on 80 and 443), and its home, data and configuration directories are the
hop's work directory, so it writes nothing outside the run. On SIGTERM it waits for open streams
at most ``grace_period`` (2 s; Caddy's default waits for ever), so a hop it stops ends in time.

``tls: true`` serves the client over TLS with the run's certificate (an ``https://`` site with ``tls
<cert> <key>``: no automatic HTTPS still); ``http2: true`` serves HTTP/2 too, by ALPN over TLS
(``protocols h1 h2``) and in the clear as h2c (``protocols h1 h2c``: prior knowledge or ``Upgrade``,
HTTP/1.1 still served). Without ``http2`` the server speaks HTTP/1.1 only where it serves TLS
(``protocols h1``); HTTP/3 is never on (it would listen on UDP too). The upstream side stays HTTP/1.1.
"""

from __future__ import annotations

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
from chaos.model.params import Param

__all__ = ["Caddy"]


@gateway_kind
class Caddy(Gateway):
    """Caddy 2 in the foreground (``caddy run``), one loopback site proxying to the upstream."""

    kind = "caddy"
    binaries = ("caddy", "/usr/bin/caddy")
    install_hint = "apt install caddy (Debian 12+) or Caddy 2 from caddyserver.com"
    config_name = "Caddyfile"
    options = GatewayOptions((
        Param("read_timeout", "duration", 300.0, min=0.001,
              doc="transport read_timeout: the longest silence from the upstream"),
        Param("write_timeout", "duration", 300.0, min=0.001, doc="transport write_timeout: writing to the upstream"),
        Param("dial_timeout", "duration", 10.0, min=0.001, doc="transport dial_timeout"),
        Param("idle_timeout", "duration", 300.0, min=0.001, doc="the server's idle timeout for client connections"),
        tls_param("caddy"),
        Param("http2", "bool", False, doc="serve HTTP/2: by ALPN over TLS (protocols h1 h2), h2c without tls"
                                          " (protocols h1 h2c: prior knowledge or Upgrade); HTTP/1.1 still served"),
    ))

    def version(self, binary: str) -> str:
        _, text = run_tool([binary, "version"])  # "2.6.2" (Debian) or "v2.7.6 h1:..." (upstream builds)
        match = re.search(r"v?(\d+\.\d+\.\d+\S*)", text)
        return match.group(1) if match else text.splitlines()[0] if text else "unknown"

    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        o = self.effective_options(options)
        upstream = Upstream.parse(upstream_root)
        return (
            "# streamchaos: caddy hop, shipped streaming configuration\n"
            "{\n\tadmin off\n\tauto_https off\n\tgrace_period 2s\n"
            f"\tstorage file_system {workdir / 'data'}\n"
            f"\tservers {{\n\t\ttimeouts {{\n\t\t\tidle {millis(o['idle_timeout'])}\n\t\t}}\n"
            + self._protocols(o)
            + "\t}\n}\n"
            f"{'https' if o['tls'] else 'http'}://127.0.0.1:{listen_port} {{\n"
            "\tbind 127.0.0.1\n"
            + self._tls(workdir, o)
            + f"\treverse_proxy {upstream.root} {{\n"
            "\t\tflush_interval -1\n"
            "\t\ttransport http {\n"
            f"\t\t\tdial_timeout {millis(o['dial_timeout'])}\n"
            f"\t\t\tread_timeout {millis(o['read_timeout'])}\n"
            f"\t\t\twrite_timeout {millis(o['write_timeout'])}\n"
            + self._upstream_tls(workdir, upstream)
            + "\t\t}\n\t}\n}\n"
        )

    @staticmethod
    def _protocols(o: Mapping[str, Any]) -> str:
        """The server's protocols: Caddy's default (h1 h2 h3) where nothing was asked, so the shipped
        configuration without TLS or HTTP/2 stays what it was (HTTP/1.1 only, in the clear)."""
        if o["http2"]:
            return f"\t\tprotocols h1 {'h2' if o['tls'] else 'h2c'}\n"
        return "\t\tprotocols h1\n" if o["tls"] else ""

    @staticmethod
    def _tls(workdir: Path, o: Mapping[str, Any]) -> str:
        if not o["tls"]:
            return ""
        files = TlsFiles.under(workdir)
        return f"\ttls {files.cert} {files.key}\n"

    @staticmethod
    def _upstream_tls(workdir: Path, upstream: Upstream) -> str:
        """TLS to an https upstream: verified with the system's CAs, or the run's where the run serves it."""
        if upstream.scheme != "https":
            return ""
        ca = upstream_ca(workdir, upstream)
        return f"\t\t\ttls\n\t\t\ttls_trusted_ca_certs {ca}\n" if ca else "\t\t\ttls\n"

    def environment(self, workdir: Path) -> dict[str, str]:
        # Caddy keeps certificates, autosaves and its PKI under these: the hop's own directory
        return {"HOME": str(workdir), "XDG_DATA_HOME": str(workdir), "XDG_CONFIG_HOME": str(workdir)}

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        status, text = run_tool([binary, "validate", "--config", str(config_path), "--adapter", "caddyfile"],
                                env=self.environment(workdir), cwd=workdir)
        return None if status == 0 else quote_lines(text, ("Error:",))

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "run", "--config", str(config_path), "--adapter", "caddyfile"]
