"""`path[].kind: haproxy`: Debian's HAProxy as a streaming reverse proxy.

``timeout server`` is HAProxy's idle limit towards the upstream (a silence longer than it cuts the
stream), ``timeout client`` the same towards the client; both come from the options (default 300 s).
Without ``option http-no-delay`` HAProxy sends an event stream in ~200 ms bursts (it marks its sends
MSG_MORE: measured in tests/thirdparty), so the shipped configuration sets it unless ``no_delay: false``.
It runs in the foreground (``-db``), its alerts and warnings on stderr (the hop's log).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaos.hops.gateways.base import Gateway, Upstream, gateway_kind, millis, quote_lines, run_tool
from chaos.model.params import Param, Schema

__all__ = ["Haproxy"]


@gateway_kind
class Haproxy(Gateway):
    """HAProxy in the foreground, HTTP mode, one frontend on loopback and one server: the upstream."""

    kind = "haproxy"
    binaries = ("haproxy", "/usr/sbin/haproxy")
    install_hint = "apt install haproxy (Debian) or the haproxy package of your system"
    config_name = "haproxy.cfg"
    options = Schema((
        Param("server_timeout", "duration", 300.0, min=0.001,
              doc="timeout server: the longest silence from the upstream"),
        Param("client_timeout", "duration", 300.0, min=0.001,
              doc="timeout client: the longest silence from the client"),
        Param("connect_timeout", "duration", 10.0, min=0.001, doc="timeout connect"),
        Param("no_delay", "bool", True, doc="option http-no-delay: each event sent at once, not in ~200 ms bursts"),
        Param("maxconn", "int", 4096, min=16, doc="connections it holds at once"),
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
            server += f" ssl verify required ca-file @system-ca sni str({upstream.host})"
        return (
            "# streamchaos: haproxy hop, shipped streaming configuration\n"
            f"global\n  maxconn {o['maxconn']}\n"
            "defaults\n  mode http\n"
            f"  timeout connect {millis(o['connect_timeout'])}\n"
            f"  timeout client {millis(o['client_timeout'])}\n"
            f"  timeout server {millis(o['server_timeout'])}\n"
            + ("  option http-no-delay\n" if o["no_delay"] else "")
            + f"frontend front\n  bind 127.0.0.1:{listen_port}\n  default_backend upstream\n"
            f"backend upstream\n  {server}\n"
        )

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        status, text = run_tool([binary, "-c", "-f", str(config_path)], cwd=workdir)
        return None if status == 0 else quote_lines(text, ("[ALERT]",))

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "-db", "-f", str(config_path)]
