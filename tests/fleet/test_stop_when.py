"""``safety.stop_when`` against a real Prometheus and Alertmanager scraping a real builtin stack.

One stack, one Prometheus (scrape and rule evaluation every second, one alert rule on the stack's own
``vllm:num_requests_running``, sent to the Alertmanager) and one Alertmanager serve the module. A run's
load makes the expression true; each test checks what the run did then:

- a ``critical`` expression halts the run (exit 4, faults reverted) within two evaluation intervals
  of the first scraped sample that made it true, and the halt names the source, expression and value;
- an Alertmanager alert (the rule's, fired by Prometheus itself) halts it within two intervals of
  the alert's ``startsAt``; an alert already active refuses the run before the target is touched;
- ``error`` fails the run (a ``stop_when`` verdict, exit 1), ``warning`` is recorded, through a
  bearer-token proxy;
- a PromQL syntax error is the experiment's mistake (exit 2, its key path), an unreachable source
  refuses the run (exit 4).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict
from chaos.stack.process import StackProcess
from tests.fleet.servers import Server, alertmanager, bearer_proxy, prometheus, push_alert, resolve_alert

EVERY_S = 1.0  # Prometheus's scrape and evaluation interval, and every source's read period
RUNNING = "vllm:num_requests_running > 0"
RULES = f"""
groups:
  - name: streamchaos-test
    rules:
      - alert: StreamchaosTestLoad
        expr: {RUNNING}
        for: 0s
        labels: {{severity: critical, team: chaos-test}}
        annotations: {{summary: "requests running on the stack"}}
"""


def _need(binary: str) -> None:
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (Debian: apt-get install {binary}; .ci/run installs it)")


@dataclass
class Fleet:
    stack: StackProcess
    prometheus: Server
    alertmanager: Server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    _need("prometheus")
    _need("prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("fleet")
    stack = StackProcess.start("--port", "0", timeout=60.0)
    try:
        with alertmanager(tmp / "am") as am, prometheus(
                tmp / "prom", scrape_targets=[stack.url.split("://", 1)[1].split("/", 1)[0]], rules_yaml=RULES,
                alertmanager_url=am.url, interval_s=EVERY_S) as prom:
            _scraping(prom)
            yield Fleet(stack, prom, am)
    finally:
        stack.close()


def _scraping(prom: Server, timeout_s: float = 20.0) -> None:
    """Wait until Prometheus has scraped the stack once (its scrape manager takes up new targets on a 5 s
    tick: a run begun before then would meet a Prometheus with no data of the stack at all)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{prom.url}/api/v1/query", params={"query": 'up{job="stack"} == 1'}).json()["data"]["result"]:
            return
        time.sleep(0.2)
    pytest.fail(f"Prometheus did not scrape the stack within {timeout_s:g}s (log: {prom.log})")


def _discovered(prom: Server, timeout_s: float = 20.0) -> None:
    """Wait until Prometheus knows its Alertmanager (it looks every 5 s, and an alert that fires before
    is sent nowhere until the next resend), so a rule's alert reaches it as in a fleet running for a while."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{prom.url}/api/v1/alertmanagers").json()["data"]["activeAlertmanagers"]:
            return
        time.sleep(0.2)
    pytest.fail(f"Prometheus did not find its Alertmanager within {timeout_s:g}s (log: {prom.log})")


def _quiet(fleet: Fleet, timeout_s: float = 20.0) -> None:
    """Wait until the stack's last scrape shows nothing running and no test alert is active: each run
    starts from a fleet that says go."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = httpx.get(f"{fleet.prometheus.url}/api/v1/query", params={"query": RUNNING}).json()
        alerts = httpx.get(f"{fleet.alertmanager.url}/api/v2/alerts",
                           params={"active": "true", "filter": 'team="chaos-test"'}).json()
        if not running["data"]["result"] and not alerts:
            return
        time.sleep(0.25)
    pytest.fail("the fleet did not go quiet between runs")


# the fault is in force from the phase's start, before the load's first request: whenever the expression
# becomes true, the halt finds a fault to revert
SLOWED = [{"name": "slowed", "duration": "6s",
           "faults": [{"kind": "client.slow_reader", "read_delay": "2ms", "fraction": 0.5}]}]


def _run(tmp_path: Path, fleet: Fleet, stop_when: list[dict[str, Any]], *, name: str = "fleet",
         phases: list[dict[str, Any]] | None = None, sla: list[dict[str, Any]] | None = None) -> Any:
    experiment = experiment_from_dict({
        "name": name, "seed": 1, "load": {"concurrency": 4, "max_tokens": 24},
        "phases": phases or [{"name": "load", "duration": "6s"}],
        "safety": {"max_duration": "60s", "drain_timeout": "2s", "cleanup_window": "100ms",
                   "stop_when": stop_when},
        "sla": sla or [{"kind": "errors", "budget": "5%"}],
    })
    return asyncio.run(make_runner(experiment, target_url=fleet.stack.url, out_dir=tmp_path / "run",
                                   handle_signals=False).run())


def _report(result: Any) -> dict[str, Any]:
    return json.loads((Path(result.out_dir) / "report.json").read_text())


def _first_true_sample(fleet: Fleet, since: float) -> float:
    """When the stack's first scraped sample with requests running was taken, after ``since``: the
    moment the expression became true in Prometheus."""
    body = httpx.get(f"{fleet.prometheus.url}/api/v1/query",
                     params={"query": "vllm:num_requests_running[2m]"}).json()
    stamps = [float(t) for series in body["data"]["result"] for t, v in series["values"]
              if float(v) > 0 and float(t) >= since]
    assert stamps, body
    return min(stamps)


@pytest.mark.slow
def test_a_critical_expression_halts_the_run_within_two_intervals(tmp_path: Path, fleet: Fleet) -> None:
    _quiet(fleet)
    started = time.time()
    result = _run(tmp_path, fleet, [{
        "source": "prometheus", "prometheus_url": fleet.prometheus.url, "every": f"{EVERY_S:g}s",
        "alerts": [{"expr": RUNNING, "severity": "critical", "description": "{{$value}} requests running"}]}],
        phases=SLOWED)
    assert result.status == "halted" and result.exit_code == 4, result.error
    report = _report(result)
    halt = report["halt"]
    assert "prometheus[0]" in halt["reason"] and RUNNING in halt["reason"] and "requests running" in halt["reason"]
    (firing,) = halt["stop_when"]["firing"][:1]
    assert firing["value"] >= 1, firing
    assert len(result.observations.notes_on("halt")) == 1
    # when the run took the halt (its note), against when Prometheus's data first made the expression true
    lag = report["start"] + halt["at_s"] - _first_true_sample(fleet, started)
    print(f"halt {lag:.3f}s after the first sample that made the expression true (bound {2 * EVERY_S:g}s)")
    assert 0 <= lag <= 2 * EVERY_S, lag
    assert report["fleet"]["stop_when_reads"][0]["halted"] is True
    (fault,) = report["faults"]  # in force when the fleet said stop, and reverted
    assert fault["injected_at"] is not None and fault["reverted_at"] is not None, fault


@pytest.mark.slow
def test_error_fails_the_run_and_warning_is_recorded_through_a_bearer_token(
        tmp_path: Path, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(fleet)
    monkeypatch.setenv("TEST_PROM_TOKEN", "s3cret-token")
    with bearer_proxy(tmp_path / "proxy", fleet.prometheus.url, "s3cret-token") as proxy:
        result = _run(tmp_path, fleet, [{
            "source": "prometheus", "prometheus_url": proxy.url, "every": "500ms",
            "bearer_token_env": "TEST_PROM_TOKEN",
            "alerts": [{"expr": RUNNING, "severity": "error", "description": "load on the stack"},
                       {"expr": "vector(1)", "severity": "warning", "description": "always"}]}],
            phases=[{"name": "load", "duration": "3s"}])
    assert result.status == "completed" and result.exit_code == 1, result.error
    report = _report(result)
    (verdict,) = [v for v in report["verdicts"] if v["sla"] == "stop_when"]
    assert verdict["status"] == "fail" and verdict["evidence"]["expr"] == RUNNING, verdict
    assert [v["status"] for v in report["verdicts"] if v["sla"] == "errors"] == ["pass"]
    warned = [n for n in report["fleet"]["stop_when"] if n["severity"] == "warning"]
    assert warned and warned[0]["before_start"] is True and warned[0]["description"] == "always", warned
    for file in Path(result.out_dir).rglob("*"):  # the token is in no file of the run
        assert not file.is_file() or b"s3cret" not in file.read_bytes(), file


@pytest.mark.slow
def test_a_bad_expression_is_the_experiments_mistake_a_firing_or_silent_source_refuses_the_run(
        tmp_path: Path, fleet: Fleet) -> None:
    bad = _run(tmp_path / "bad", fleet, [{
        "source": "prometheus", "prometheus_url": fleet.prometheus.url,
        "alerts": [{"expr": "sum(vllm:num_requests_running", "severity": "critical"}]}])
    assert bad.exit_code == 2, bad.error
    assert "safety.stop_when[0].alerts[0]" in bad.error and "parse error" in bad.error, bad.error
    assert bad.target is None
    firing = _run(tmp_path / "firing", fleet, [{  # a critical expression true already: not started
        "source": "prometheus", "prometheus_url": fleet.prometheus.url,
        "alerts": [{"expr": "vector(3)", "severity": "critical", "description": "{{$value}} pages open"}]}])
    assert firing.exit_code == 4 and firing.target is None, firing.error
    assert "not started while the fleet says stop" in firing.error and "3 pages open" in firing.error, firing.error
    silent = _run(tmp_path / "silent", fleet, [{
        "source": "alertmanager", "alertmanager_url": "http://127.0.0.1:9", "timeout": "500ms",
        "matchers": ['severity="critical"']}])
    assert silent.exit_code == 4 and "not started without its stop signals" in silent.error, silent.error
    assert silent.target is None


@pytest.mark.slow
def test_an_alertmanager_alert_halts_the_run_and_an_active_one_refuses_it(tmp_path: Path, fleet: Fleet) -> None:
    _discovered(fleet.prometheus)  # by now, as a rule: the Prometheus-only tests ran while it looked
    _quiet(fleet)
    source = {"source": "alertmanager", "alertmanager_url": fleet.alertmanager.url, "every": f"{EVERY_S:g}s",
              "matchers": ['alertname="StreamchaosTestLoad"', 'severity=~"critical|page"']}
    result = _run(tmp_path / "halt", fleet, [source])
    assert result.status == "halted" and result.exit_code == 4, result.error
    report = _report(result)
    halt = report["halt"]
    assert "StreamchaosTestLoad" in halt["reason"], halt
    (firing,) = halt["stop_when"]["firing"][:1]
    lag = report["start"] + halt["at_s"] - firing["since"]
    print(f"halt {lag:.3f}s after the alert's startsAt (bound {2 * EVERY_S:g}s)")
    assert 0 <= lag <= 2 * EVERY_S, lag

    # an alert already active: the run is refused before the target is reached
    _quiet(fleet)
    labels = {"alertname": "StreamchaosTestLoad", "severity": "page", "team": "chaos-test"}
    push_alert(fleet.alertmanager.url, labels, annotations={"summary": "on-call paged"})
    try:
        refused = _run(tmp_path / "refused", fleet, [source])
    finally:
        resolve_alert(fleet.alertmanager.url, labels)
    assert refused.status == "failed" and refused.exit_code == 4, refused.error
    assert "not started while the fleet says stop" in refused.error and "StreamchaosTestLoad" in refused.error
    assert refused.observations.streams == [] and refused.target is None
