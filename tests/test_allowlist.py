"""safety.allowed_targets: what the pure matcher allows, and a run refused before it touches anything."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict
from chaos.load.mock import ThreadedMockServer
from chaos.model.allowlist import (
    enforce,
    experiment_reach,
    host_allowed,
    implies,
    is_loopback,
    parse_host_entry,
    parse_selector,
    refusals,
)
from chaos.model.context import AllowedTargets, Reach
from chaos.model.errors import TargetNotAllowed
from chaos.model.observations import Observations

pytestmark = pytest.mark.timeout(60)


# ---- the pure matcher ------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "localhost", "LOCALHOST.", "[::1]", "::1"])
def test_loopback_is_recognised_as_written(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "vllm", "localhost.evil.com", "127.0.0.1.nip.io", "0.0.0.0", "[fd00::1]"])
def test_everything_else_is_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize(("entry", "url", "allowed"), [
    ("vllm", "http://vllm:8000/v1", True),
    ("vllm", "http://VLLM.:9000/", True),  # any port, case and a trailing dot do not matter
    ("vllm", "http://vllm.staging.svc:8000/v1", False),  # a name is matched whole
    ("vllm:8000", "http://vllm:8000/v1", True),
    ("vllm:8000", "http://vllm:8001/v1", False),
    ("*.staging.example.com", "https://gw.staging.example.com/v1", True),
    ("*.staging.example.com", "https://staging.example.com/v1", False),
    ("*.staging.example.com", "https://gw.staging.example.com.evil.net/v1", False),
    ("10.0.0.0/8", "http://10.2.3.4:8000/v1", True),
    ("10.0.0.0/8", "http://11.2.3.4:8000/v1", False),
    ("10.0.0.0/8", "http://ten.internal:8000/v1", False),  # names are never resolved to match a CIDR
    ("10.1.2.3", "http://10.1.2.3:1/", True),
    ("[fd00::7]:8000", "http://[fd00::7]:8000/v1", True),
    ("[fd00::7]:8000", "http://[fd00::7]:8001/v1", False),
    ("http://gw:8080/v1", "http://gw:8080/v1", True),
    ("http://gw:8080/v1", "http://gw:8080/v1/", True),
    ("http://gw:8080/v1", "http://gw:8080/v10", False),  # a path prefix ends at a segment
    ("http://gw:8080/v1", "https://gw:8080/v1", False),
    ("http://gw/v1", "http://gw:80/v1", True),  # the scheme's default port
    ("https://gw", "https://gw:443/anything", True),
])
def test_host_entries(entry: str, url: str, allowed: bool) -> None:
    assert host_allowed(url, [parse_host_entry(entry)]) is allowed


def test_loopback_needs_no_entry() -> None:
    assert host_allowed("http://127.0.0.1:1234/v1", []) and host_allowed("http://localhost/v1", [])
    assert not host_allowed("http://192.0.2.2:1234/v1", [])


@pytest.mark.parametrize("bad", ["", "bad host", "10.0.0.0/33", "ftp://x", "http://gw:99999", "a:b", "x.*.com",
                                 "vllm:0"])
def test_malformed_host_entries_say_what_is_allowed(bad: str) -> None:
    with pytest.raises(ValueError, match=r"host|CIDR|URL|port"):
        parse_host_entry(bad)


@pytest.mark.parametrize(("selector", "allowed", "implied"), [
    ("app=vllm", "app=vllm", True),
    ("app=vllm,tier=gpu", "app=vllm", True),  # narrower: fine
    ("tier=gpu", "app=vllm", False),  # other pods
    ("", "app=vllm", False),  # the whole namespace
    ("app in (vllm)", "app=vllm", True),
    ("app in (vllm,sglang)", "app=vllm", False),
    ("app=vllm", "app in (vllm,sglang)", True),
    ("app=vllm", "app", True),
    ("app", "app=vllm", False),
    ("app=vllm", "tier!=prod", False),
    ("app=vllm,tier=staging", "tier!=prod", True),
    ("tier notin (prod,canary)", "tier!=prod", True),
    ("tier notin (canary)", "tier!=prod", False),
    ("!tier", "tier notin (prod)", True),
    ("!canary,app=vllm", "!canary", True),
    ("app=vllm", "!canary", False),
    ("app.kubernetes.io/name==vllm", "app.kubernetes.io/name=vllm", True),
])
def test_a_selector_is_allowed_only_when_it_implies_an_allowed_one(selector: str, allowed: str, implied: bool) -> None:
    own = parse_selector(selector) if selector else ()
    assert implies(own, parse_selector(allowed)) is implied


@pytest.mark.parametrize("bad", ["", "app=", "tier in (a,b", "app==vllm,", "a b", "-app=x", "app=vl lm"])
def test_malformed_selectors(bad: str) -> None:
    if bad == "app=":  # an empty value is a valid label value
        assert parse_selector(bad)[0].values == frozenset({""})
        return
    with pytest.raises(ValueError, match="selector"):
        parse_selector(bad)


def test_refusals_name_what_and_what_would_allow_it() -> None:
    reaches = [
        Reach("target", url="http://vllm:8000/v1"),
        Reach("Toxiproxy API", url="http://127.0.0.1:8474"),
        Reach("fault kill (k8s.pod_kill)", namespace="staging", selector="app=vllm"),
    ]
    none = refusals(reaches, None)
    assert len(none) == 2
    assert "target http://vllm:8000/v1" in none[0] and "add 'vllm'" in none[0] \
        and "no safety.allowed_targets" in none[0]
    assert "namespace 'staging'" in none[1]
    assert refusals(reaches, AllowedTargets(hosts=("vllm",), namespaces=("stag*",))) == []
    narrow = refusals(reaches, AllowedTargets(hosts=("vllm",), namespaces=("staging",),
                                              selectors=("app=vllm,tier=gpu",)))
    assert len(narrow) == 1 and "selector 'app=vllm'" in narrow[0] and "app=vllm,tier=gpu" in narrow[0]
    whole = refusals([Reach("fault f", namespace="staging")],
                     AllowedTargets(namespaces=("staging",), selectors=("app=vllm",)))
    assert len(whole) == 1 and "every pod of the namespace" in whole[0]


def _experiment(url: str | None, allowed: dict[str, list[str]] | None = None,
                proxy: dict[str, str] | None = None) -> object:
    data: dict[str, object] = {
        "name": "allow", "load": {"concurrency": 1, "max_tokens": 2},
        "phases": [{"name": "p", "duration": "500ms"}],
        "safety": {"max_duration": "30s", "drain_timeout": "2s", "cleanup_window": "100ms"},
    }
    if url:
        data["target"] = {"kind": "openai", "url": url}
    if allowed is not None:
        data["safety"] = {**data["safety"], "allowed_targets": allowed}  # type: ignore[dict-item]
    if proxy is not None:
        data["proxy"] = proxy
    return experiment_from_dict(data)


def test_the_reach_of_an_experiment_counts_target_override_and_external_proxy() -> None:
    exp = _experiment("http://vllm:8000/v1", proxy={"server": "auto", "url": "http://toxi:8474"})
    assert [(r.what, r.url) for r in experiment_reach(exp, environ={})] == [  # type: ignore[arg-type]
        ("target", "http://vllm:8000/v1"), ("Toxiproxy API", "http://toxi:8474")]
    assert experiment_reach(exp, "http://other:1/v1",  # type: ignore[arg-type]
                            environ={})[0].url == "http://other:1/v1"
    local = _experiment(None, proxy={"server": "embedded"})
    assert experiment_reach(local, environ={"TOXIPROXY_URL": "http://toxi:8474"}) == []  # type: ignore[arg-type]
    auto = _experiment(None, proxy={"server": "auto"})
    assert experiment_reach(auto,  # type: ignore[arg-type]
                            environ={"TOXIPROXY_URL": "http://toxi:8474"})[0].what == "Toxiproxy API"
    with pytest.raises(TargetNotAllowed) as info:
        enforce(exp, environ={})  # type: ignore[arg-type]
    assert info.value.exit_code == 2 and "vllm" in str(info.value) and "toxi" in str(info.value)


# ---- the runner refuses before anything starts --------------------------------------------------------


def _outward_address() -> str:
    """An address of this host that is not loopback (no packet is sent: a UDP connect only picks a route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            address = str(s.getsockname()[0])
    except OSError:
        address = ""
    if not address or is_loopback(address):
        pytest.skip("this host has no non-loopback IPv4 address to serve a 'remote' target on")
    return address


def test_a_remote_target_without_an_allow_list_is_refused_before_any_contact(tmp_path: Path) -> None:
    address = _outward_address()
    with ThreadedMockServer(host=address, tick_s=0.001) as server:
        runner = make_runner(_experiment(server.base_url),  # type: ignore[arg-type]
                             out_dir=tmp_path / "run", handle_signals=False)
        result = asyncio.run(runner.run())
        assert server.server.connections_opened == 0  # not even a GET /v1/models
    assert result.status == "failed" and result.exit_code == 2
    assert address in (result.error or "") and "safety.allowed_targets" in (result.error or "")
    assert not result.observations.streams and not (tmp_path / "run" / "stack.log").exists()
    notes = [n.topic for n in Observations.load(tmp_path / "run" / "journal.jsonl").notes]
    assert "target" not in notes and "run_error" in notes


def test_an_allowed_remote_target_is_run(tmp_path: Path) -> None:
    address = _outward_address()
    with ThreadedMockServer(host=address, tick_s=0.001) as server:
        experiment = _experiment(server.base_url, {"hosts": [f"{address}/32"]})
        result = asyncio.run(make_runner(experiment,  # type: ignore[arg-type]
                                         out_dir=tmp_path / "run", handle_signals=False).run())
        assert server.server.connections_opened > 0
    assert result.status == "completed", result.error
    assert result.observations.streams
    (note,) = result.observations.notes_on("allowed_targets")
    assert note.data["checked"] == [{"what": "target", "url": server.base_url}]
