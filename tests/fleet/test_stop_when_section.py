"""``safety.stop_when`` and ``safety.lever`` as the loader reads them: each source's keys, krkn alert
profiles inline or from a file, matchers checked, and every mistake located by its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.experiment import experiment_from_dict, load_experiment
from chaos.model.errors import ExperimentInvalid


def _safety(**safety: Any) -> Any:
    return experiment_from_dict({"name": "s", "phases": [{"name": "p", "duration": "1s"}], "safety": safety,
                                 "sla": [{"kind": "errors", "budget": "1%"}]}).safety


def test_sources_parse_with_their_own_keys() -> None:
    safety = _safety(stop_when=[
        {"source": "prometheus", "prometheus_url": "http://prom:9090", "every": "2s", "bearer_token_env": "T",
         "alerts": [{"expr": "up == 0", "description": "{{$labels.job}} down", "severity": "error"},
                    {"expr": "vector(1)"}]},
        {"source": "alertmanager", "alertmanager_url": "https://am.example:9093",
         "matchers": ['severity=~"critical|page"', "team!=dev"]},
    ], lever={"namespace": "game-days", "every": "500ms"})
    prom, am = safety.stop_when
    assert (prom.source, prom.url, prom.every, prom.bearer_token_env, prom.name) == (
        "prometheus", "http://prom:9090", 2.0, "T", "prometheus[0]")
    assert [(a.expr, a.severity) for a in prom.alerts] == [("up == 0", "error"), ("vector(1)", "critical")]
    assert prom.alerts[0].where == "safety.stop_when[0].alerts[0]"
    assert am.matchers == ('severity=~"critical|page"', "team!=dev") and am.every == 5.0
    assert safety.lever.namespace == "game-days" and safety.lever.every == 0.5


def test_a_krkn_profile_file_is_read_relative_to_the_experiment(tmp_path: Path) -> None:
    (tmp_path / "alerts.yaml").write_text(
        "- expr: avg_over_time(vllm:num_requests_waiting[1m]) > 10\n  description: queue {{$value}}\n"
        "  severity: critical\n- expr: up == 0\n  description: scrape down\n  severity: warning\n")
    (tmp_path / "exp.yaml").write_text(
        "name: s\nphases: [{name: p, duration: 1s}]\nsla: [{kind: errors, budget: 1%}]\n"
        "safety:\n  stop_when:\n    - source: prometheus\n      prometheus_url: http://127.0.0.1:9090\n"
        "      profile: alerts.yaml\n")
    (source,) = load_experiment(tmp_path / "exp.yaml").safety.stop_when
    assert [a.severity for a in source.alerts] == ["critical", "warning"]
    assert source.alerts[1].where.endswith("alerts.yaml[1]")


@pytest.mark.parametrize(("entry", "where", "said"), [
    ({"source": "graphite", "url": "x"}, "stop_when[0].source", "unknown source 'graphite'"),
    ({"source": "prometheus", "alerts": [{"expr": "up"}]}, "stop_when[0]", "prometheus_url"),
    ({"source": "prometheus", "prometheus_url": "prom:9090", "alerts": [{"expr": "up"}]},
     "stop_when[0].prometheus_url", "http://"),
    ({"source": "prometheus", "prometheus_url": "http://p"}, "stop_when[0]", "give alerts:"),
    ({"source": "prometheus", "prometheus_url": "http://p", "alerts": [{"expr": "up", "severity": "page"}]},
     "stop_when[0].alerts[0].severity", "critical"),
    ({"source": "alertmanager", "alertmanager_url": "http://a", "matchers": ["severity=~(critical"]},
     "stop_when[0].matchers[0]", ""),
    ({"source": "alertmanager", "alertmanager_url": "http://a"}, "stop_when[0]", "matchers"),
])
def test_mistakes_are_located(entry: dict[str, Any], where: str, said: str) -> None:
    with pytest.raises(ExperimentInvalid) as caught:
        _safety(stop_when=[entry])
    message = str(caught.value)
    assert f"safety.{where}" in message and said in message, message


def test_a_lever_configmap_is_in_the_runs_role() -> None:
    from chaos.k8s.manifests import experiment_rules

    experiment = experiment_from_dict({"name": "s", "phases": [{"name": "p", "duration": "1s"}],
                                       "safety": {"lever": {"namespace": "game-days", "configmap": "stop"}},
                                       "sla": [{"kind": "errors", "budget": "1%"}]})
    (rule,) = experiment_rules(experiment)
    assert (rule.resource, rule.verbs, rule.names) == ("configmaps", ("get",), ("stop",))


@pytest.mark.parametrize("url", ["http://prom:99999", "prom:9090", "http://", "http://pr om:9090"])
def test_a_url_that_cannot_be_reached_is_located(url: str) -> None:
    with pytest.raises(ExperimentInvalid, match=r"safety\.stop_when\[0\]\.prometheus_url"):
        _safety(stop_when=[{"source": "prometheus", "prometheus_url": url, "alerts": [{"expr": "up"}]}])


def test_two_signals_may_not_share_a_name() -> None:
    with pytest.raises(ExperimentInvalid, match=r"stop_when\[1\]\.name.*duplicate name 'fleet'"):
        _safety(stop_when=[
            {"source": "prometheus", "name": "fleet", "prometheus_url": "http://a", "alerts": [{"expr": "up"}]},
            {"source": "alertmanager", "name": "fleet", "alertmanager_url": "http://b", "matchers": ["a=b"]}])
