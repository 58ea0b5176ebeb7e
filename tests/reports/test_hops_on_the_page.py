"""The path on report.html: each hop with its effective configuration, no claim that the load went
straight to the target when it went through hops, and a hop verdict's nested figures in their own unit
(``relay``'s ``added_latency_ms`` is milliseconds, not a share of the verdict's fraction)."""

from __future__ import annotations

import re

from chaos.output.reports.environment import render_environment
from chaos.output.reports.html import kv_table

NGINX_CONF = "server {\n  listen 127.0.0.1:39963;\n  proxy_read_timeout 10000ms;\n}\n"
PATH = [
    {"name": "outer", "kind": "stream", "listen": "127.0.0.1:41557", "upstream": "http://127.0.0.1:39963",
     "base_url": "http://127.0.0.1:41557/v1", "version": "0.1.0", "pid": 486, "config": None,
     "log": "/tmp/run/hops/outer.log"},
    {"name": "nginx", "kind": "nginx", "listen": "127.0.0.1:39963", "upstream": "http://127.0.0.1:33383",
     "base_url": "http://127.0.0.1:39963/v1", "version": "1.22.1", "pid": 484, "config": NGINX_CONF,
     "log": "/tmp/run/hops/nginx.log"},
]


def _text(markup: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", markup))


def test_a_path_without_toxiproxy_is_not_called_a_straight_line_to_the_target() -> None:
    page = render_environment({"path": PATH, "proxy": None, "environment": {}})
    assert "went straight to the target" not in page
    assert "hop outer (stream)" in page and "hop nginx (nginx)" in page
    # with no path at all, the old words still hold
    assert "went straight to the target" in render_environment({"path": None, "proxy": None, "environment": {}})


def test_a_started_gateways_effective_configuration_is_on_the_page() -> None:
    page = render_environment({"path": PATH, "proxy": None, "environment": {}})
    assert "<pre>" in page and "proxy_read_timeout 10000ms;" in page
    assert "listen 127.0.0.1:39963;\n" in page  # as written, lines kept
    hop_rows = re.findall(r"<tr><th>hop outer \(stream\)</th><td>(.*?)</td></tr>", page, re.S)
    assert hop_rows and "<pre>" not in hop_rows[0]  # a hop without one shows none


def test_a_configuration_is_escaped() -> None:
    hostile = [{**PATH[1], "config": "</pre><script>alert(1)</script>"}]
    page = render_environment({"path": hostile, "proxy": None, "environment": {}})
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_nested_figures_take_the_unit_their_key_names_not_the_verdicts() -> None:
    evidence = {"altered_streams": 0, "added_latency_ms": {"events": 6675, "p50": 0.0512, "p99": 3.1844, "max": 7.84},
                "hangup_to_upstream_closed": {"outer": {"n": 74, "p50_s": 0.000521}}}
    text = _text(kv_table(evidence, unit="fraction"))
    assert "%" not in text, text
    assert "p50 51.2us" in text and "p99 3.2ms" in text and "max 7.8ms" in text, text
    assert "events 6,675" in text  # a count stays a count
    assert "p50_s 521.0us" in text
    seconds = _text(kv_table({"hold_s": {"p50": 1.5, "max": 2.25, "n": 3}}, unit="fraction"))
    assert "p50 1.50s" in seconds and "max 2.25s" in seconds and "n 3" in seconds, seconds
    # a figure key under a key without a unit keeps the verdict's own unit, as before
    assert "p50 5.00%" in _text(kv_table({"by_phase": {"p50": 0.05}}, unit="fraction"))


def test_an_interrupted_survival_search_says_so_on_its_page() -> None:
    from chaos.output.reports.survival import render_survival

    body = {"experiment": "gw", "path": [{"name": "inner", "kind": "stream"}], "rule_hop": "inner", "max_s": 40.0,
            "resolution_s": 1.0, "keepalive_s": 2.0, "budget_s": 600.0, "took_s": 9.0, "exit_code": 4,
            "not_finished": ["hold"], "errors": [], "interrupted": True,
            "dimensions": [{"dimension": "hold", "what": "first event held", "finished": False,
                            "why": "not finished: interrupted", "longest_whole_s": None, "shortest_cut_s": None,
                            "probes": []}]}
    page = _text(render_survival(body))
    assert "Interrupted" in page and "stopped" in page, page
    assert "Interrupted" not in _text(render_survival({**body, "interrupted": False}))
