"""`sla.proxy_fix`: the buffering hop's own fix, named from the response headers it left."""

from __future__ import annotations

import pytest

from sla.proxy_fix import buffering_fix, proxy_name

pytestmark = pytest.mark.timeout(30)


def test_nginx_compressing_is_told_to_turn_gzip_off_for_event_streams() -> None:
    fix = buffering_fix("nginx/1.22.1", None, "gzip")
    assert "nginx" in fix and "Server: nginx/1.22.1" in fix and "Content-Encoding: gzip" in fix
    assert "gzip off for text/event-stream" in fix and "proxy_buffering off" in fix
    assert "http-no-delay" not in fix


def test_nginx_without_compression_is_told_proxy_buffering_and_x_accel_buffering() -> None:
    fix = buffering_fix("nginx", None, None)
    assert "proxy_buffering off" in fix and "X-Accel-Buffering: no" in fix and "gzip" not in fix


def test_caddy_is_named_by_its_server_or_via_header() -> None:
    assert "flush_interval -1" in buffering_fix("Caddy", None, None)
    assert "flush_interval -1" in buffering_fix(None, "1.1 Caddy", None)
    assert proxy_name(None, "1.1 Caddy") == "caddy"


def test_no_proxy_named_lists_haproxy_and_nginx() -> None:
    for server in (None, "uvicorn"):  # HAProxy adds no Server header and passes the upstream's through
        fix = buffering_fix(server, None, None)
        assert fix.startswith("a proxy in front")
        assert "option http-no-delay" in fix and "proxy_buffering off" in fix and "flush_interval -1" in fix
    assert "Server: uvicorn" in buffering_fix("uvicorn", None, None)


def test_an_unnamed_compressing_hop_is_told_to_stop_compressing_event_streams() -> None:
    fix = buffering_fix(None, None, "deflate")
    assert "Content-Encoding: deflate" in fix and "compression off for text/event-stream" in fix
    assert buffering_fix(None, None, "identity") == buffering_fix(None, None, None)
