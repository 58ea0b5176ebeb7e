"""HTTP API conformance (reference §1): status codes, shapes, headers, fixed messages,
listen resolution, stickiness, populate, reset, and what updates do to live connections."""

from __future__ import annotations

import json
import socket

import pytest
from tpx_support import Server, closed_within, connect, port_of, recv_exact

ERR_CT = "text/plain; charset=utf-8"


def assert_error(r, status: int, message: str | None = None, prefix: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == ERR_CT
    assert r.content.endswith(b"}\n")
    body = json.loads(r.content)
    assert body["status"] == status
    if message is not None:
        assert body["error"] == message
    if prefix is not None:
        assert body["error"].startswith(prefix), body["error"]
    assert len(r.headers["x-toxiproxy-request-id"]) == 20


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# -- common behaviour ----------------------------------------------------------------------
def test_version(toxiproxy: Server) -> None:
    r = toxiproxy.client.get("/version")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json;charset=utf-8"
    body = r.content
    assert body.startswith(b'{"version": "') and body.endswith(b'"}\n')
    if toxiproxy.embedded:
        assert body == b'{"version": "2.12.0"}\n'
    assert len(r.headers["x-toxiproxy-request-id"]) == 20


@pytest.mark.parametrize("path", ["/nope", "/proxies/", "/version/", "/proxies/x/toxics/", "/metrics"])
def test_unknown_path_is_404(toxiproxy: Server, path: str) -> None:
    r = toxiproxy.client.get(path)
    assert r.status_code == 404
    assert r.content == b"404 page not found\n"
    assert r.headers["content-type"] == ERR_CT
    assert "x-toxiproxy-request-id" not in r.headers


@pytest.mark.parametrize(
    "method,path",
    [("HEAD", "/version"), ("GET", "/reset"), ("DELETE", "/proxies"), ("PUT", "/proxies/x"), ("GET", "/populate")],
)
def test_wrong_method_is_405(toxiproxy: Server, method: str, path: str) -> None:
    r = toxiproxy.client.request(method, path)
    assert r.status_code == 405
    assert r.content == b""
    if method == "HEAD" and not toxiproxy.embedded:
        # real 2.12.0 answers HEAD /version with no Content-Length at all (measured)
        assert "content-length" not in r.headers
    else:
        # ... ours sends Content-Length: 0 there too: the one documented difference left
        assert r.headers.get("content-length") == "0"
    assert "x-toxiproxy-request-id" not in r.headers


def test_browser_user_agent_is_403(toxiproxy: Server) -> None:
    r = toxiproxy.client.get("/proxies", headers={"User-Agent": "Mozilla/5.0 (X11)"})
    assert r.status_code == 403
    assert r.content == b"User agent not allowed\n"
    assert r.headers["content-type"].startswith("text/plain")
    assert len(r.headers["x-toxiproxy-request-id"]) == 20
    assert toxiproxy.client.get("/proxies", headers={"User-Agent": "curl/8 Mozilla/5.0"}).status_code == 200


def test_keep_alive_many_requests(toxiproxy: Server) -> None:
    for _ in range(20):
        assert toxiproxy.client.get("/version").status_code == 200


# -- proxies ---------------------------------------------------------------------------------
def test_create_proxy_shape(toxiproxy: Server, upstreams) -> None:
    name = toxiproxy.name()
    r = toxiproxy.client.post(
        "/proxies", json={"name": name, "upstream": f"127.0.0.1:{upstreams.echo_port}", "listen": "127.0.0.1:0"}
    )
    assert r.status_code == 201
    assert r.headers["content-type"] == "application/json"
    assert not r.content.endswith(b"\n")
    p = r.json()
    assert p["name"] == name and p["enabled"] is True and p["toxics"] == []
    assert p["upstream"] == f"127.0.0.1:{upstreams.echo_port}"
    assert p["listen"].startswith("127.0.0.1:") and port_of(p) > 0
    keys = [k for k in p if k != "Logger"]
    assert keys == ["name", "listen", "upstream", "enabled", "toxics"]
    s = connect(port_of(p))
    s.sendall(b"ping")
    assert recv_exact(s, 4) == b"ping"
    s.close()


@pytest.mark.parametrize(
    "listen,expect_host",
    [("127.0.0.1:0", "127.0.0.1"), ("localhost:0", "127.0.0.1"), ("", "[::]"), (":0", "[::]"), ("0.0.0.0:0", "[::]")],
)
def test_listen_resolution(toxiproxy: Server, upstreams, listen: str, expect_host: str) -> None:
    p = toxiproxy.create(upstreams.echo_port, listen=listen)
    host, port = p["listen"].rsplit(":", 1)
    assert host == expect_host and int(port) > 0
    s = connect(int(port))  # dual-stack for [::]: reachable on 127.0.0.1
    s.sendall(b"x")
    assert recv_exact(s, 1) == b"x"
    s.close()


def test_create_disabled_echoes_raw_listen(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port, listen="127.0.0.1:0", enabled=False)
    assert p["enabled"] is False and p["listen"] == "127.0.0.1:0"


def test_create_validation(toxiproxy: Server) -> None:
    c = toxiproxy.client
    assert_error(c.post("/proxies", content=b""), 400, "bad request body: EOF")
    assert_error(c.post("/proxies", content=b"{nope"), 400, prefix="bad request body: ")
    assert_error(c.post("/proxies", json={"upstream": "127.0.0.1:1"}), 400, "missing required field: name")
    assert_error(c.post("/proxies", json={"name": "", "upstream": "x:1"}), 400, "missing required field: name")
    assert_error(c.post("/proxies", json={"name": "a"}), 400, "missing required field: upstream")
    assert_error(c.post("/proxies", json={"name": 5, "upstream": "x:1"}), 400, prefix="bad request body: ")
    assert_error(c.post("/proxies", json={"upstream": 5}), 400, prefix="bad request body: ")  # decode first
    assert c.get("/proxies").json() == {}


def test_create_decoding_quirks(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    up = f"127.0.0.1:{upstreams.echo_port}"
    # case-insensitive keys, trailing garbage ignored, content-type ignored, unknown keys ignored
    body = json.dumps({"NAME": "quirk1", "UpStream": up, "Listen": "127.0.0.1:0", "zzz": 1}) + " garbage{"
    r = c.post("/proxies", content=body.encode(), headers={"Content-Type": "text/plain"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "quirk1" and r.json()["upstream"] == up
    # last duplicate wins; enabled null means true
    body = '{"name":"x","name":"quirk2","upstream":"%s","listen":"127.0.0.1:0","enabled":null}' % up
    r = c.post("/proxies", content=body.encode())
    assert r.status_code == 201 and r.json()["name"] == "quirk2" and r.json()["enabled"] is True


def test_duplicate_proxy_409(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port)
    r = toxiproxy.client.post("/proxies", json={"name": p["name"], "upstream": "127.0.0.1:1"})
    assert_error(r, 409, "proxy already exists")


def test_bind_failures_500(toxiproxy: Server, upstreams) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = toxiproxy.client.post(
            "/proxies",
            json={"name": "clash", "upstream": "127.0.0.1:1", "listen": f"127.0.0.1:{busy.getsockname()[1]}"},
        )
        assert_error(r, 500)
        r = toxiproxy.client.post("/proxies", json={"name": "noport", "upstream": "127.0.0.1:1", "listen": "127.0.0.1"})
        assert_error(r, 500)
        assert toxiproxy.client.get("/proxies").json() == {}
    finally:
        busy.close()


def test_get_list_delete(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    b = toxiproxy.create(upstreams.echo_port, name="b-proxy")
    a = toxiproxy.create(upstreams.echo_port, name="a-proxy")
    r = c.get("/proxies")
    assert r.status_code == 200 and list(r.json()) == ["a-proxy", "b-proxy"]
    assert r.json()["a-proxy"]["listen"] == a["listen"]
    assert c.get("/proxies/b-proxy").json()["listen"] == b["listen"]
    assert_error(c.get("/proxies/nope"), 404, "proxy not found")
    r = c.delete("/proxies/a-proxy")
    assert r.status_code == 204 and r.content == b"" and "content-type" not in r.headers
    assert_error(c.delete("/proxies/a-proxy"), 404, "proxy not found")
    assert refused(port_of(a))


def test_name_with_space_percent_encoded(toxiproxy: Server, upstreams) -> None:
    toxiproxy.create(upstreams.echo_port, name="has space")
    assert toxiproxy.client.get("/proxies/has%20space").status_code == 200


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_disable_enable_sticky_port(toxiproxy: Server, upstreams, method: str) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)
    port = port_of(p)
    live = connect(port)
    r = c.request(method, f"/proxies/{p['name']}", json={"enabled": False})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert closed_within(live, 3) in ("eof", "reset")
    assert refused(port)
    r = c.request(method, f"/proxies/{p['name']}", json={"enabled": True})
    assert r.status_code == 200 and r.json()["enabled"] is True and port_of(r.json()) == port
    s = connect(port)
    s.sendall(b"ok")
    assert recv_exact(s, 2) == b"ok"
    s.close()


def test_update_noop_keeps_live_connection(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)
    s = connect(port_of(p))
    assert c.patch(f"/proxies/{p['name']}", json={}).status_code == 200
    assert (
        c.patch(
            f"/proxies/{p['name']}", json={"name": "ignored", "upstream": p["upstream"], "listen": p["listen"]}
        ).json()["name"]
        == p["name"]
    )
    s.sendall(b"still")
    assert recv_exact(s, 5) == b"still"
    s.close()


def test_update_upstream_restarts(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)
    s = connect(port_of(p))
    s.sendall(b"a")
    assert recv_exact(s, 1) == b"a"
    r = c.patch(f"/proxies/{p['name']}", json={"upstream": f"127.0.0.1:{upstreams.ticker_port}"})
    assert r.status_code == 200 and port_of(r.json()) == port_of(p)
    assert closed_within(s, 3) in ("eof", "reset")
    t = connect(port_of(p))
    t.sendall(b"1 0\n")
    assert t.recv(100).startswith(b"0 ")
    t.close()


def test_update_listen_port_zero_moves(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port)
    r = toxiproxy.client.patch(f"/proxies/{p['name']}", json={"listen": "127.0.0.1:0"})
    assert r.status_code == 200 and port_of(r.json()) != port_of(p)


def test_update_errors(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port)
    c = toxiproxy.client
    assert_error(c.patch("/proxies/nope", json={}), 404, "proxy not found")
    assert_error(c.patch(f"/proxies/{p['name']}", content=b""), 400, "bad request body: EOF")
    assert_error(c.patch(f"/proxies/{p['name']}", json={"enabled": "yes"}), 400, prefix="bad request body: ")
    assert_error(c.patch(f"/proxies/{p['name']}", json={"listen": "127.0.0.1"}), 500)


# -- populate ------------------------------------------------------------------------------------
def test_populate(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    up = f"127.0.0.1:{upstreams.echo_port}"
    r = c.post(
        "/populate",
        json=[
            {"name": "pop1", "upstream": up, "listen": "127.0.0.1:0"},
            {"name": "pop2", "upstream": up, "listen": "127.0.0.1:0", "enabled": False},
        ],
    )
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    out = r.json()["proxies"]
    assert [p["name"] for p in out] == ["pop1", "pop2"]
    assert out[0]["enabled"] is True and out[1]["enabled"] is False
    pop1 = out[0]
    toxiproxy.toxic("pop1", "latency", latency=10)
    # same resolved listen + upstream: left untouched (toxics kept), returned live
    r = c.post("/populate", json=[{"name": "pop1", "upstream": up, "listen": pop1["listen"], "enabled": False}])
    got = r.json()["proxies"][0]
    assert r.status_code == 201 and got["enabled"] is True and len(got["toxics"]) == 1
    assert got["listen"] == pop1["listen"]
    # a :0 listen always differs: replaced on a new port, toxics gone
    r = c.post("/populate", json=[{"name": "pop1", "upstream": up, "listen": "127.0.0.1:0"}])
    got = r.json()["proxies"][0]
    assert got["toxics"] == [] and got["listen"] != pop1["listen"]


def test_populate_empty_and_errors(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    r = c.post("/populate", json=[])
    assert r.status_code == 201 and r.content == b'{"proxies":null}'
    r = c.post("/populate", json=[{"name": "ok", "upstream": "127.0.0.1:1"}, {"upstream": "127.0.0.1:1"}])
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert not r.content.endswith(b"\n")
    assert r.json() == {"error": "missing required field: name at proxy 2", "status": 400, "proxies": None}
    r = c.post("/populate", json=[{"name": "x"}])
    assert r.json()["error"] == "missing required field: upstream at proxy 1"
    r = c.post("/populate", content=b"")
    assert r.status_code == 400 and r.json()["error"] == "bad request body: EOF" and r.json()["proxies"] is None
    r = c.post("/populate", json={"name": "x", "upstream": "y:1"})
    assert r.status_code == 400 and r.json()["error"].startswith("bad request body: ")
    assert c.get("/proxies").json() == {}  # nothing was created


def test_populate_bind_failure_partial(toxiproxy: Server, upstreams) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        up = f"127.0.0.1:{upstreams.echo_port}"
        r = toxiproxy.client.post(
            "/populate",
            json=[
                {"name": "first", "upstream": up, "listen": "127.0.0.1:0"},
                {"name": "clash", "upstream": up, "listen": f"127.0.0.1:{busy.getsockname()[1]}"},
                {"name": "never", "upstream": up, "listen": "127.0.0.1:0"},
            ],
        )
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["status"] == 500 and [p["name"] for p in body["proxies"]] == ["first"]
        assert sorted(toxiproxy.client.get("/proxies").json()) == ["first"]
    finally:
        busy.close()


# -- reset ------------------------------------------------------------------------------------
def test_reset(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)
    toxiproxy.toxic(p["name"], "latency", latency=1000)
    c.patch(f"/proxies/{p['name']}", json={"enabled": False})
    r = c.post("/reset", content=b"ignored body")
    assert r.status_code == 204 and r.content == b""
    got = c.get(f"/proxies/{p['name']}").json()
    assert got["enabled"] is True and got["toxics"] == [] and got["listen"] == p["listen"]
    s = connect(port_of(p))
    s.sendall(b"r")
    assert recv_exact(s, 1) == b"r"
    s.close()


def test_delete_closes_live_connections(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port)
    s = connect(port_of(p))
    s.sendall(b"a")
    assert recv_exact(s, 1) == b"a"
    assert toxiproxy.client.delete(f"/proxies/{p['name']}").status_code == 204
    assert closed_within(s, 3) in ("eof", "reset")


def test_unreachable_upstream_accept_then_eof(toxiproxy: Server) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    p = toxiproxy.create(port)
    s = connect(port_of(p))
    assert closed_within(s, 3) in ("eof", "reset")


# -- toxics API -------------------------------------------------------------------------------------
def test_toxic_create_shape_and_defaults(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)["name"]
    r = c.post(f"/proxies/{p}/toxics", json={"type": "latency"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {
        "attributes": {"latency": 0, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    assert list(r.json()) == ["attributes", "name", "type", "stream", "toxicity"]
    assert b'"toxicity":1}' in r.content
    r = c.post(
        f"/proxies/{p}/toxics",
        json={"type": "slicer", "stream": "UpStream", "toxicity": 0.5, "attributes": {"average_size": 4, "bogus": 3}},
    )
    assert r.json() == {
        "attributes": {"average_size": 4, "size_variation": 0, "delay": 0},
        "name": "slicer_UpStream",
        "type": "slicer",
        "stream": "UpStream",
        "toxicity": 0.5,
    }
    r = c.post(f"/proxies/{p}/toxics", json={"type": "noop", "name": "", "attributes": None})
    assert r.json()["name"] == "noop_downstream" and r.json()["attributes"] == {}
    for t, attrs in [
        ("bandwidth", {"rate": 0}),
        ("slow_close", {"delay": 0}),
        ("timeout", {"timeout": 0}),
        ("reset_peer", {"timeout": 0}),
        ("limit_data", {"bytes": 0}),
    ]:
        r = c.post(f"/proxies/{p}/toxics", json={"type": t, "stream": "upstream", "toxicity": 0})
        assert r.status_code == 200 and r.json()["attributes"] == attrs and r.json()["toxicity"] == 0
    # listing: upstream chain first, then downstream, each in insertion order
    names = [t["name"] for t in c.get(f"/proxies/{p}/toxics").json()]
    assert names == [
        "slicer_UpStream",
        "bandwidth_upstream",
        "slow_close_upstream",
        "timeout_upstream",
        "reset_peer_upstream",
        "limit_data_upstream",
        "latency_downstream",
        "noop_downstream",
    ]
    assert [t["name"] for t in c.get(f"/proxies/{p}").json()["toxics"]] == names
    c.delete(f"/proxies/{p}/toxics/timeout_upstream")


def test_toxic_create_errors(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)["name"]
    url = f"/proxies/{p}/toxics"
    assert_error(c.post("/proxies/nope/toxics", json={"type": "latency"}), 404, "proxy not found")
    assert_error(c.post(url, content=b""), 400, "bad request body: EOF")
    assert_error(
        c.post(url, json={"type": "latency", "stream": "sideways"}),
        400,
        "stream was invalid, can be either upstream or downstream",
    )
    assert_error(
        c.post(url, json={"type": "latency", "stream": ""}),
        400,
        "stream was invalid, can be either upstream or downstream",
    )
    assert_error(c.post(url, json={"type": "latency", "stream": 5}), 400, prefix="bad request body: ")
    assert_error(c.post(url, json={"type": "nosuch"}), 400, "invalid toxic type")
    assert_error(c.post(url, json={}), 400, "invalid toxic type")
    assert_error(c.post(url, json={"type": "latency", "toxicity": "x"}), 400, prefix="bad request body: ")
    assert_error(c.post(url, json={"type": "latency", "attributes": [1]}), 400, prefix="bad request body: ")
    assert_error(
        c.post(url, json={"type": "latency", "attributes": {"latency": 1.5}}), 400, prefix="bad request body: "
    )
    c.post(url, json={"type": "latency", "name": "dup"})
    assert_error(c.post(url, json={"type": "slicer", "name": "dup", "stream": "upstream"}), 409, "toxic already exists")
    r = c.post(url, json={"type": "latency", "toxicity": 2, "attributes": {"latency": -5}})
    assert r.status_code == 200 and r.json()["toxicity"] == 2  # no validation of either


def test_toxic_get_update_delete(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)["name"]
    toxiproxy.toxic(p, "latency", name="lat", latency=100, jitter=5)
    assert c.get(f"/proxies/{p}/toxics/lat").json()["attributes"] == {"latency": 100, "jitter": 5}
    assert_error(c.get(f"/proxies/{p}/toxics/nope"), 404, "toxic not found")
    assert_error(c.get("/proxies/nope/toxics/lat"), 404, "proxy not found")
    r = c.patch(
        f"/proxies/{p}/toxics/lat",
        json={
            "attributes": {"latency": 200},
            "toxicity": 0.25,
            "name": "renamed",
            "type": "slicer",
            "stream": "upstream",
        },
    )
    assert r.status_code == 200
    assert r.json() == {
        "attributes": {"latency": 200, "jitter": 5},
        "name": "lat",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 0.25,
    }
    r = c.post(f"/proxies/{p}/toxics/lat", json={"attributes": {"jitter": 0}, "toxicity": None})
    assert r.status_code == 200 and r.json()["toxicity"] == 0.25 and r.json()["attributes"]["jitter"] == 0
    # a badly typed attribute: 400, yet the valid one in the same body already landed; toxicity did not
    r = c.patch(f"/proxies/{p}/toxics/lat", json={"attributes": {"latency": 7, "jitter": "x"}, "toxicity": 1})
    assert_error(r, 400, prefix="bad request body: ")
    got = c.get(f"/proxies/{p}/toxics/lat").json()
    assert got["attributes"]["latency"] == 7 and got["toxicity"] == 0.25
    assert_error(c.patch(f"/proxies/{p}/toxics/nope", json={}), 404, "toxic not found")
    r = c.delete(f"/proxies/{p}/toxics/lat")
    assert r.status_code == 204 and r.content == b""
    assert_error(c.delete(f"/proxies/{p}/toxics/lat"), 404, "toxic not found")
    assert c.get(f"/proxies/{p}/toxics").json() == []


def test_toxicity_is_float32(toxiproxy: Server, upstreams) -> None:
    p = toxiproxy.create(upstreams.echo_port)["name"]
    r = toxiproxy.client.post(f"/proxies/{p}/toxics", json={"type": "noop", "toxicity": 0.1})
    assert b'"toxicity":0.1}' in r.content


# -- JSON type errors in the real server's words (Toxiproxy 2.12.0, measured) ---------------------
def test_wrong_typed_fields_are_named_as_the_real_server_names_them(toxiproxy: Server, upstreams) -> None:
    c = toxiproxy.client
    p = toxiproxy.create(upstreams.echo_port)["name"]
    url = f"/proxies/{p}/toxics"
    assert_error(c.post(url, json={"type": "latency", "attributes": {"latency": "x"}}), 400,
                 "bad request body: json: cannot unmarshal string into Go struct field LatencyToxic.attributes.latency "
                 "of type int64")
    assert_error(c.post(url, json={"type": "bandwidth", "attributes": {"rate": 1.5}}), 400,
                 "bad request body: json: cannot unmarshal number 1.5 into Go struct field "
                 "BandwidthToxic.attributes.rate of type int64")
    assert_error(c.post(url, json={"type": "latency", "attributes": 5}), 400,
                 "bad request body: json: cannot unmarshal number 5 into Go struct field ToxicWrapper.attributes "
                 "of type toxics.NoopToxic")
    assert_error(c.post("/proxies", json={"name": 5, "upstream": "x:1"}), 400,
                 "bad request body: json: cannot unmarshal number 5 into Go struct field Proxy.name of type string")
    assert_error(c.post("/proxies", content=b"[1]"), 400,
                 "bad request body: json: cannot unmarshal array into Go value of type toxiproxy.Proxy")
