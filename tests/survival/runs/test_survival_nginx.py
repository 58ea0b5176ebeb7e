"""`streamchaos survival` through a real nginx: client -> stream hop -> nginx (proxy_read_timeout 5s)
-> stream hop -> builtin stack. A first event held past nginx's read timeout is cut, and the matrix
names nginx at 5 s within its resolution; with `: keep-alive` comments every 2 s the same hold gets
through nginx for the longest probe (8 s). The baseline stream (no rule set) arrives whole first:
the disarmed form passes, or the search does not start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chaos.cli import main

pytestmark = pytest.mark.timeout(180)

EXPERIMENT = """
name: survival-nginx
seed: 1
target: {kind: builtin, model: tiny}
load: {max_tokens: [8, 8]}
path:
  - {kind: stream, name: outer}
  - {kind: nginx, name: nginx, read_timeout: 5s}
  - {kind: stream, name: inner}
phases:
  - {name: steady, duration: 1s}
sla:
  - {kind: errors, budget: 0%}
"""


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").is_file():
        pytest.skip("nginx is not installed (apt install nginx-light, as .ci/run does)")
    path = tmp_path / "survival-nginx.yaml"
    path.write_text(EXPERIMENT, encoding="utf-8")
    return path


def test_nginx_read_timeout_is_found_and_named_and_keepalives_get_through(experiment: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["survival", str(experiment), "--dimensions", "hold,hold_keepalive", "--max", "8s",
                 "--resolution", "1s", "--keepalive", "2s", "--budget", "150s", "--out", str(out), "--quiet"])
    printed = capsys.readouterr()
    body = json.loads((out / "survival.json").read_text(encoding="utf-8"))
    assert code == 0, (printed.out, printed.err, body["errors"])
    assert body["baseline"]["outcome"] == "whole"  # the path with no rule: the disarmed form passes
    assert [h["name"] for h in body["path"]] == ["outer", "nginx", "inner"] and body["rule_hop"] == "inner"
    hold, keepalive = body["dimensions"]

    assert hold["dimension"] == "hold" and hold["finished"], hold["why"]
    assert hold["cut_by"] == "nginx", hold
    assert hold["how"] in ("bare_eof", "http_status"), hold["client_saw"]  # a truncated 200, or a 504 before the head
    assert hold["longest_whole_s"] is not None and hold["shortest_cut_s"] is not None
    assert 4.0 <= hold["longest_whole_s"] < hold["shortest_cut_s"] <= 6.0, hold  # 5 s ± the resolution
    assert hold["resolution_s"] <= 1.0
    assert all(p["cut_by"] == "nginx" for p in hold["probes"] if p["outcome"] == "cut")

    assert keepalive["dimension"] == "hold_keepalive" and keepalive["survives_max"], keepalive
    assert keepalive["longest_whole_s"] == 8.0 and keepalive["shortest_cut_s"] is None

    assert body["took_s"] < 100.0, body["took_s"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'data-plot="survival"' in page and "cut between" in page and "survives &ge; 8s" in page
    assert "hold: longest whole" in printed.out and "cut by nginx" in printed.out
