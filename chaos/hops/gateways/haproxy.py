"""`path[].kind: haproxy`: Debian's HAProxy as a streaming reverse proxy.

``timeout server`` is HAProxy's idle limit towards the upstream (a silence longer than it cuts the
stream), ``timeout client`` the same towards the client; both come from the options (default 300 s).
Without ``option http-no-delay`` HAProxy sends an event stream in ~200 ms bursts (it marks its sends
MSG_MORE: measured in tests/thirdparty), so the shipped configuration sets it unless ``no_delay: false``.
It runs in the foreground (``-db``), its alerts and warnings on stderr (the hop's log).

``tls: true`` serves the client over TLS with the run's certificate (``bind ... ssl crt <pem>``: the
chain and the key in one file in the hop's ``tls/`` directory, owner-only); ``http2: true`` serves HTTP/2
too, by ALPN over TLS (``alpn h2,http/1.1``), and in the clear as h2c with prior knowledge only (``proto
h2``: an HTTP/1.1 client is refused). HAProxy 2.6 answers an h2c preface on any clear HTTP bind anyway.
The bursts are HTTP/1.1-in-the-clear's alone: over TLS (HTTP/1.1 or h2) and over h2c, 40 events 10 ms
apart arrive 10 ms apart with or without ``http-no-delay`` (measured with 2.6.12,
tests/hops/test_gateways_h2.py), each in a DATA frame of its own; the option stays, harmless there.
The upstream side stays HTTP/1.1.
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

__all__ = ["Haproxy"]


@gateway_kind
class Haproxy(Gateway):
    """HAProxy in the foreground, HTTP mode, one frontend on loopback and one server: the upstream."""

    kind = "haproxy"
    binaries = ("haproxy", "/usr/sbin/haproxy")
    install_hint = "apt install haproxy (Debian) or the haproxy package of your system"
    config_name = "haproxy.cfg"
    options = GatewayOptions((
        Param("server_timeout", "duration", 300.0, min=0.001,
              doc="timeout server: the longest silence from the upstream"),
        Param("client_timeout", "duration", 300.0, min=0.001,
              doc="timeout client: the longest silence from the client"),
        Param("connect_timeout", "duration", 10.0, min=0.001, doc="timeout connect"),
        Param("no_delay", "bool", True, doc="option http-no-delay: each event sent at once, not in ~200 ms bursts"
                                          " (HTTP/1.1 in the clear; TLS and HTTP/2 do not burst)"),
        Param("maxconn", "int", 4096, min=16, doc="connections it holds at once"),
        tls_param("haproxy"),
        Param("http2", "bool", False, doc="serve HTTP/2: by ALPN over TLS (alpn h2,http/1.1), h2c with prior knowledge"
                                          " only without tls (bind ... proto h2)"),
    ))

    def version(self, binary: str) -> str:
        _, text = run_tool([binary, "-v"])  # "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"
        match = re.search(r"version (\S+)", text)
        return match.group(1) if match else text.splitlines()[0] if text else "unknown"

    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        o = self.effective_options(options)
        upstream = Upstream.parse(upstream_root)
        server = f"server upstream {upstream.hostport}"
        if upstream.scheme == "https":
            ca = upstream_ca(workdir, upstream) or "@system-ca"  # the run's CA where the run serves the upstream
            server += f" ssl verify required ca-file {ca} sni str({upstream.host})"
        return (
            "# streamchaos: haproxy hop, shipped streaming configuration\n"
            f"global\n  maxconn {o['maxconn']}\n"
            "defaults\n  mode http\n"
            f"  timeout connect {millis(o['connect_timeout'])}\n"
            f"  timeout client {millis(o['client_timeout'])}\n"
            f"  timeout server {millis(o['server_timeout'])}\n"
            + ("  option http-no-delay\n" if o["no_delay"] else "")
            + f"frontend front\n  {self._bind(listen_port, workdir, o)}\n  default_backend upstream\n"
            f"backend upstream\n  {server}\n"
        )

    @staticmethod
    def _bind(port: int, workdir: Path, o: Mapping[str, Any]) -> str:
        bind = f"bind 127.0.0.1:{port}"
        if o["tls"]:
            alpn = "h2,http/1.1" if o["http2"] else "http/1.1"
            return f"{bind} ssl crt {TlsFiles.under(workdir).cert_key} alpn {alpn}"
        return f"{bind} proto h2" if o["http2"] else bind

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        status, text = run_tool([binary, "-c", "-f", str(config_path)], cwd=workdir)
        return None if status == 0 else quote_lines(text, ("[ALERT]",))

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "-db", "-f", str(config_path)]
