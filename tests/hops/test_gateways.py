"""The real gateways as data: each shipped configuration rendered for streaming, a user's file as a
template (substituted; refused, located, when it could not listen where the run says), the option
schemas, and the one-line error naming the package when a binary is missing. Pure: nothing is started
(tests/hops/runs/test_gateway_processes.py starts them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from chaos.hops.gateways.base import (
    GATEWAY_KINDS,
    Gateway,
    Upstream,
    gateway_class,
    gateway_kinds,
    millis,
    quote_lines,
    read_template,
    substitute,
    template_problems,
    template_values,
    validate_user_config,
)
from chaos.hops.gateways.caddy import Caddy
from chaos.hops.gateways.haproxy import Haproxy
from chaos.hops.gateways.litellm import Litellm
from chaos.hops.gateways.nginx import Nginx
from chaos.hops.process import _decode_address, _is_loopback
from chaos.model.errors import ExperimentInvalid, SetupFailed

UPSTREAM = "http://127.0.0.1:8123"
WORKDIR = Path("/run/streamchaos/hops/edge")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def test_every_gateway_kind_is_registered_with_its_facts() -> None:
    kinds = gateway_kinds()
    assert list(kinds) == ["caddy", "haproxy", "litellm", "nginx"]
    for kind, cls in kinds.items():
        gateway = cls()  # every abstract method implemented
        assert gateway.kind == kind and GATEWAY_KINDS[kind] is cls
        assert gateway.binaries and gateway.install_hint and gateway.config_name
        assert gateway.options.names(), kind


def test_an_unknown_kind_names_the_known_ones_and_the_closest() -> None:
    with pytest.raises(SetupFailed, match=r"gateway kind 'ngnix' is not known \(did you mean 'nginx'\?\); "
                                          r"known: caddy, haproxy, litellm, nginx"):
        gateway_class("ngnix")


def test_nginx_ships_a_streaming_configuration_on_loopback() -> None:
    text = Nginx().render(8080, UPSTREAM, WORKDIR, {})
    lines = _lines(text)
    assert "listen 127.0.0.1:8080;" in lines
    assert "proxy_pass http://127.0.0.1:8123;" in lines  # no URI: each request's path passes unchanged
    for directive in ("proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                      "proxy_read_timeout 300000ms;", "proxy_send_timeout 300000ms;", "proxy_connect_timeout 10000ms;"):
        assert directive in lines, directive
    assert "gzip on;" not in lines and "proxy_ignore_headers X-Accel-Buffering;" not in lines
    for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        assert f"{temp}_temp_path {WORKDIR / temp};" in lines
    assert "daemon off;" not in text  # the command line says it, for a user's file too


def test_nginx_options_set_the_knobs() -> None:
    options, problems = Nginx.options.parse({"read_timeout": "5s", "send_timeout": "250ms", "gzip": True,
                                             "buffering": True, "ignore_x_accel_buffering": True,
                                             "http_version": "1.0"})
    assert problems == []
    lines = _lines(Nginx().render(8080, UPSTREAM, WORKDIR, options))
    for directive in ("proxy_read_timeout 5000ms;", "proxy_send_timeout 250ms;", "gzip on;",
                      "gzip_types text/event-stream;", "proxy_buffering on;", "proxy_http_version 1.0;",
                      "proxy_ignore_headers X-Accel-Buffering;"):
        assert directive in lines, directive


def test_nginx_to_an_https_upstream_sends_its_name() -> None:
    lines = _lines(Nginx().render(8080, "https://api.example.com", WORKDIR, {}))
    assert "proxy_pass https://api.example.com:443;" in lines and "proxy_ssl_server_name on;" in lines


def test_haproxy_ships_timeouts_and_no_delay() -> None:
    lines = _lines(Haproxy().render(8081, UPSTREAM, WORKDIR, {}))
    assert "bind 127.0.0.1:8081" in lines and "server upstream 127.0.0.1:8123" in lines
    assert {"timeout server 300000ms", "timeout client 300000ms", "timeout connect 10000ms",
            "option http-no-delay", "mode http"} <= set(lines)
    options, _ = Haproxy.options.parse({"server_timeout": "5s", "no_delay": False})
    lines = _lines(Haproxy().render(8081, UPSTREAM, WORKDIR, options))
    assert "timeout server 5000ms" in lines and "option http-no-delay" not in lines


def test_caddy_ships_flush_at_once_and_transport_timeouts() -> None:
    text = Caddy().render(8082, UPSTREAM, WORKDIR, {"read_timeout": 5.0})
    lines = _lines(text)
    assert "http://127.0.0.1:8082 {" in lines and "bind 127.0.0.1" in lines
    assert "reverse_proxy http://127.0.0.1:8123 {" in lines and "flush_interval -1" in lines
    assert {"read_timeout 5000ms", "write_timeout 300000ms", "dial_timeout 10000ms", "admin off",
            "auto_https off"} <= set(lines)
    assert f"storage file_system {WORKDIR / 'data'}" in lines
    assert Caddy().environment(WORKDIR)["XDG_DATA_HOME"] == str(WORKDIR)


def test_litellm_routes_every_model_to_the_upstream_and_keeps_keys_out_of_the_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_MASTER_KEY", "sk-never-in-the-file-123")
    options, problems = Litellm.options.parse({"master_key_env": "EDGE_MASTER_KEY", "upstream_key_env": "UP_KEY",
                                               "timeout": "30s"})
    assert problems == []
    text = Litellm().render(4000, UPSTREAM, WORKDIR, options)
    assert "sk-never-in-the-file-123" not in text
    config = yaml.safe_load(text)
    assert config["model_list"] == [{"model_name": "*", "litellm_params": {
        "model": "openai/*", "api_base": "http://127.0.0.1:8123/v1", "api_key": "os.environ/UP_KEY", "timeout": 30.0}}]
    # the client's X-Request-Id forwarded upstream, so the taps behind LiteLLM pair with the client's streams
    assert config["general_settings"] == {"master_key": "os.environ/EDGE_MASTER_KEY",
                                          "forward_client_headers_to_llm_api": True}
    keyless = yaml.safe_load(Litellm().render(4000, UPSTREAM, WORKDIR, {}))
    assert keyless["model_list"][0]["litellm_params"]["api_key"] == "none"
    assert keyless["general_settings"] == {"dangerously_permit_weak_or_unset_master_key": True,
                                           "forward_client_headers_to_llm_api": True}


def test_litellm_listens_where_its_command_line_says() -> None:
    gateway = Litellm()
    assert gateway.listen_in_config is False
    command = gateway.command("/venv/bin/litellm", WORKDIR / "config.yaml", WORKDIR, 4000)
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "4000"
    assert gateway.binaries == (str(Path(sys.executable).parent / "litellm"),)  # this environment's, no other


def test_litellm_check_refuses_a_key_variable_that_is_not_set(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGE_MASTER_KEY", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text(Litellm().render(4000, UPSTREAM, tmp_path, {"master_key_env": "EDGE_MASTER_KEY"}))
    complaint = Litellm().check("litellm", config, tmp_path)
    assert complaint is not None and "os.environ/EDGE_MASTER_KEY, which is not set" in complaint
    monkeypatch.setenv("EDGE_MASTER_KEY", "sk-set-now-0123")
    assert Litellm().check("litellm", config, tmp_path) is None
    config.write_text("model_list: []\n")
    assert "no model_list" in (Litellm().check("litellm", config, tmp_path) or "")


@pytest.mark.parametrize("cls", [Nginx, Haproxy, Caddy, Litellm], ids=lambda c: c.kind)
def test_option_schemas_parse_units_and_refuse_unknown_keys(cls: type[Gateway]) -> None:
    defaults = cls().effective_options()
    assert set(defaults) == set(cls.options.names())
    _, problems = cls.options.parse({"read_timout": "5s"})
    assert problems and problems[0][0] == "read_timout" and "unknown key" in problems[0][1]
    durations = [p for p in cls.options.params if p.kind == "duration"]
    assert durations, cls.kind
    values, problems = cls.options.parse({durations[0].name: "1.5s"})
    assert problems == [] and values[durations[0].name] == 1.5
    _, problems = cls.options.parse({durations[0].name: "5"})  # a bare number is ambiguous
    assert problems and "unit" in problems[0][1]


def test_template_values_and_substitution() -> None:
    values = template_values(8080, "http://[::1]:9000/v1", WORKDIR)
    assert values == {"listen": "127.0.0.1:8080", "port": "8080", "upstream": "http://[::1]:9000",
                      "upstream_hostport": "[::1]:9000", "workdir": str(WORKDIR)}
    text = "listen {{listen}};\nproxy_pass {{ upstream }};\n# {{port}} {{upstream_hostport}} {{workdir}}\n"
    assert substitute(text, values) == (f"listen 127.0.0.1:8080;\nproxy_pass http://[::1]:9000;\n"
                                        f"# 8080 [::1]:9000 {WORKDIR}\n")


def test_template_problems_locate_unknown_placeholders_and_a_missing_listen() -> None:
    assert template_problems("listen {{port}};\n") == []
    problems = template_problems("events {}\n  proxy_pass {{upstrem}};\n")
    assert problems[0][:2] == (2, 14) and "unknown placeholder {{upstrem}} (did you mean 'upstream'?)" in problems[0][2]
    assert problems[1][:2] == (0, 0) and "neither {{listen}} nor {{port}}" in problems[1][2]
    assert template_problems("model_list: []\n", needs_listen=False) == []


def test_a_config_file_without_listen_is_refused_located_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nginx.conf"
    path.write_text("http {\n  server {\n    listen 8080;\n    proxy_pass {{upstream}};\n  }\n}\n")
    with pytest.raises(ExperimentInvalid) as caught:
        read_template(path, key="path[1].config")
    assert caught.value.exit_code == 2
    assert str(caught.value) == (f"{path}: path[1].config: the file contains neither {{{{listen}}}} nor {{{{port}}}}:"
                                 " the gateway could not listen where the run says (a free port on 127.0.0.1);"
                                 " write e.g. `listen {{listen}};`")
    path.write_text("listen {{listen}};\nproxy_pass {{upstream}}{{oops}};\n")
    with pytest.raises(ExperimentInvalid, match=rf"^{path}:2:24: unknown placeholder \{{\{{oops\}}\}}"):
        read_template(path)


def test_a_config_path_that_does_not_exist_is_a_located_error(tmp_path: Path) -> None:
    with pytest.raises(ExperimentInvalid, match=r"path\[0\]\.config: gateway configuration .*absent.conf: "
                                                r"No such file or directory"):
        read_template(tmp_path / "absent.conf", key="path[0].config")


class _Absent(Nginx):
    binaries = ("streamchaos-no-such-nginx", "/nonexistent/sbin/nginx")


def test_a_missing_binary_is_one_line_naming_the_package() -> None:
    with pytest.raises(SetupFailed) as caught:
        _Absent().find_binary()
    message = str(caught.value)
    assert caught.value.exit_code == 4 and "\n" not in message
    assert message == ("nginx: no nginx binary here (looked for streamchaos-no-such-nginx, /nonexistent/sbin/nginx);"
                       " install it: apt install nginx-light (Debian) or the nginx package of your system")


def test_an_empty_path_finds_only_absolute_binaries(tmp_path: Path) -> None:
    class OnPathOnly(Haproxy):
        binaries = ("haproxy",)

    with pytest.raises(SetupFailed, match=r"^haproxy: no haproxy binary here \(looked for haproxy\); install it: "
                                          r"apt install haproxy"):
        OnPathOnly().find_binary(search_path="")
    fake = tmp_path / "haproxy"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o700)
    assert OnPathOnly().find_binary(search_path=str(tmp_path)) == str(fake)


def test_validating_a_user_config_without_the_binary_reports_only_the_template(tmp_path: Path) -> None:
    path = tmp_path / "nginx.conf"
    path.write_text("listen {{listen}};\n")
    assert validate_user_config(_Absent(), path) == []  # the missing binary is the run's to say (exit 4)
    path.write_text("listen 80;\n")
    problems = validate_user_config(_Absent(), path, key="path[0].config")
    assert len(problems) == 1 and problems[0].file == str(path) and problems[0].path == "path[0].config"


def test_upstreams_are_http_urls_with_a_host() -> None:
    assert Upstream.parse("http://127.0.0.1:8000/v1").root == "http://127.0.0.1:8000"
    assert Upstream.parse("https://api.example.com").hostport == "api.example.com:443"
    for bad in ("127.0.0.1:8000", "ftp://h:1", "http://:80", "http://h:99999"):
        with pytest.raises(SetupFailed, match="upstream"):
            Upstream.parse(bad)


def test_small_helpers() -> None:
    assert millis(300) == "300000ms" and millis(0.0001) == "1ms" and millis(0.25) == "250ms"
    assert quote_lines("a\n[ALERT] one\nb\n[ALERT] two\n", ("[ALERT]",)) == "[ALERT] one | [ALERT] two"
    assert quote_lines("only\nthis\n", ("[emerg]",)) == "only | this"
    assert _decode_address("0100007F:1F90") == "127.0.0.1:8080"
    assert _decode_address("00000000000000000000000001000000:0050") == "[::1]:80"
    assert _is_loopback("127.0.0.1:8080") and _is_loopback("[::1]:80") and _is_loopback("[::ffff:127.0.0.1]:80")
    assert not _is_loopback("0.0.0.0:8080") and not _is_loopback("[::]:80")
