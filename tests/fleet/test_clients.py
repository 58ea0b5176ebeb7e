"""chaos.fleet's clients: the pure readers against written answers, then the calls against a real Prometheus
2.42, Alertmanager 0.25 and an nginx asking for a bearer token (tests/fleet/servers.py), one of each for the
module. A rule's alert going from Prometheus to Alertmanager, the whole pipeline, is run by
tests/fleet/test_stop_when.py, where it halts a run."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.fleet.alertmanager import Alert, Matcher, active_alerts, parse_alerts, parse_matcher
from chaos.fleet.prometheus import Sample, instant_query, parse_query_response, render_description
from chaos.model.errors import FleetSignalError
from tests.fleet.servers import Server, alertmanager, bearer_proxy, prometheus, push_alert, resolve_alert
from tests.thirdparty.servers import free_port

TOKEN = "fleet-token-0123456789"


def _vector(*series: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": labels, "value": [1700000000.5, value]} for labels, value in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def _scalar(value: str) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1.5, value]}}).encode()


# --- Prometheus answers, read ---------------------------------------------------------------------------

def test_a_vector_is_one_sample_per_series() -> None:
    body = _vector(({"job": "api", "instance": "a:1"}, "0"), ({"job": "api"}, "NaN"), ({}, "+Inf"))
    samples = parse_query_response(body)
    assert [s.labels for s in samples] == [{"job": "api", "instance": "a:1"}, {"job": "api"}, {}]
    assert samples[0].value == 0.0 and samples[1].value != samples[1].value and samples[2].value == float("inf")
    assert parse_query_response(_vector()) == []


def test_a_scalar_fires_when_non_zero_and_not_nan() -> None:
    assert parse_query_response(_scalar("2.5")) == [Sample({}, 2.5)]
    assert parse_query_response(_scalar("-1")) == [Sample({}, -1.0)]
    assert parse_query_response(_scalar("0")) == []
    assert parse_query_response(_scalar("NaN")) == []


def test_a_matrix_series_is_read_by_its_last_point() -> None:
    result = [{"metric": {"a": "1"}, "values": [[1, "3"], [2, "4"]]}, {"metric": {"a": "2"}, "values": []}]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
    assert parse_query_response(body) == [Sample({"a": "1"}, 4.0)]


def test_an_error_is_rejected_only_when_it_is_bad_data() -> None:
    bad = {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unclosed left parenthesis"}
    with pytest.raises(FleetSignalError, match="unclosed left parenthesis") as caught:
        parse_query_response(json.dumps(bad).encode(), url="http://prom:9090/api/v1/query")
    assert caught.value.rejected and "http://prom:9090/api/v1/query" in str(caught.value)
    busy = {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"}
    with pytest.raises(FleetSignalError, match="too many samples") as caught:
        parse_query_response(json.dumps(busy).encode())
    assert not caught.value.rejected


@pytest.mark.parametrize("body", [b"<html>gateway</html>", b'{"data": 1}', b'{"status": "success", "data": {}}',
                                  b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}'])
def test_a_garbled_answer_is_no_answer(body: bytes) -> None:
    with pytest.raises(FleetSignalError, match="Prometheus") as caught:
        parse_query_response(body)
    assert not caught.value.rejected


def test_a_string_result_cannot_fire_and_is_the_experiments_fault() -> None:
    body = json.dumps({"status": "success", "data": {"resultType": "string", "result": [1, "up"]}}).encode()
    with pytest.raises(FleetSignalError, match="string") as caught:
        parse_query_response(body)
    assert caught.value.rejected


def test_a_description_renders_value_and_labels_and_nothing_else() -> None:
    sample = Sample({"instance": "gpu-3", "job": "vllm"}, 0.125)
    assert render_description("{{$labels.instance}} at {{ $value }} ({{ $labels.job }}{{$labels.nope}})",
                              sample) == "gpu-3 at 0.125 (vllm)"
    assert render_description("{{$value}}", Sample({}, 1234567890.0)) == "1.23457e+09"
    assert render_description("{{ .Value }} {{$value}}", None) == "{{ .Value }} "


# --- Alertmanager matchers and answers, read ------------------------------------------------------------

@pytest.mark.parametrize(("text", "matcher"), [
    ('alertname="GPUDown"', Matcher("alertname", "=", "GPUDown")),
    ('severity =~ "critical|page"', Matcher("severity", "=~", "critical|page")),
    ("team!=ml", Matcher("team", "!=", "ml")),
    ('job!~"batch-.*"', Matcher("job", "!~", "batch-.*")),
    (r'msg="say \"hi\""', Matcher("msg", "=", 'say "hi"')),
    ('env=""', Matcher("env", "=", "")),
])
def test_a_matcher_is_read_and_written_back(text: str, matcher: Matcher) -> None:
    assert parse_matcher(text) == matcher
    assert parse_matcher(matcher.text) == matcher


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"), ("severity", "no operator"), ("1x=a", "label name"), ('a="open', "not closed"),
    ('a="x"y"', "escaped"), ('a=~"(unclosed"', "not a regular expression"), ('a=b"c', "quoted whole"),
])
def test_a_bad_matcher_says_what_is_wrong_and_shows_a_right_one(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        parse_matcher(text)
    assert 'alertname="GPUDown"' in str(caught.value)


def test_alerts_are_read_with_nanosecond_and_offset_times() -> None:
    body = json.dumps([
        {"labels": {"alertname": "GPUDown", "gpu": "3"}, "annotations": {"summary": "gone"},
         "startsAt": "2024-05-01T12:00:00.123456789Z", "endsAt": "2024-05-01T12:05:00Z",
         "fingerprint": "abc", "status": {"state": "active", "silencedBy": [], "inhibitedBy": []}},
        {"labels": {"team": "ml"}, "startsAt": "2024-05-01T14:00:00+02:00", "status": {"state": "suppressed"}},
    ]).encode()
    first, second = parse_alerts(body)
    assert first == Alert({"alertname": "GPUDown", "gpu": "3"}, {"summary": "gone"}, 1714564800.123456789, "abc",
                          "active")
    assert first.name == "GPUDown" and second.name == "" and second.state == "suppressed"
    assert second.starts_at == 1714564800.0 and second.annotations == {}


@pytest.mark.parametrize("body", [b"not json", b'{"alerts": []}', b'[{"labels": {}}]',
                                  b'[{"labels": {}, "startsAt": "yesterday"}]'])
def test_a_garbled_alert_list_is_no_answer(body: bytes) -> None:
    with pytest.raises(FleetSignalError, match="Alertmanager") as caught:
        parse_alerts(body)
    assert not caught.value.rejected


async def test_a_server_that_never_answers_times_out_within_the_bound() -> None:
    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(FleetSignalError, match="did not answer within 0.3s") as caught:
            await instant_query(url, "vector(1)", timeout_s=0.3)
        assert not caught.value.rejected and time.monotonic() - started < 2.0


async def test_an_unreachable_server_is_no_answer_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(FleetSignalError, match=f"{url}/api/v1/query could not be reached") as caught:
        await instant_query(url, "vector(1)")
    assert not caught.value.rejected and time.monotonic() - started < 2.0
    with pytest.raises(FleetSignalError, match=f"{url}/api/v2/alerts could not be reached") as caught:
        await active_alerts(url, ['alertname="X"'])
    assert not caught.value.rejected


# --- the real servers -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="module")
def am(fleet_tmp: Path) -> Iterator[Server]:
    with alertmanager(fleet_tmp) as server:
        yield server


@pytest.fixture(scope="module")
def prom(fleet_tmp: Path) -> Iterator[Server]:
    with prometheus(fleet_tmp, interval_s=0.5) as server:
        yield server


@pytest.mark.slow
async def test_an_expression_that_returns_something_fires(prom: Server) -> None:
    assert await instant_query(prom.url, "vector(1)") == [Sample({}, 1.0)]
    assert await instant_query(prom.url + "/", "vector(1) > 2") == []
    assert await instant_query(prom.url, "scalar(vector(0))") == []


@pytest.mark.slow
async def test_a_syntax_error_is_rejected_with_prometheus_words(prom: Server) -> None:
    with pytest.raises(FleetSignalError, match="parse error") as caught:
        await instant_query(prom.url, "sum(")
    assert caught.value.rejected and f"{prom.url}/api/v1/query" in str(caught.value) and "'sum('" in str(caught.value)


@pytest.mark.slow
async def test_a_bearer_token_opens_the_proxy_and_nothing_else_does(prom: Server, fleet_tmp: Path) -> None:
    with bearer_proxy(fleet_tmp, prom.url, TOKEN) as proxy:
        assert await instant_query(proxy.url, "vector(1)", token=TOKEN) == [Sample({}, 1.0)]
        for token in ("wrong-token", None):
            with pytest.raises(FleetSignalError, match="401, unauthorized: check the bearer token") as caught:
                await instant_query(proxy.url, "vector(1)", token=token)
            assert not caught.value.rejected and TOKEN not in str(caught.value)
        with pytest.raises(FleetSignalError, match="unauthorized") as caught:
            await active_alerts(proxy.url, [], token="wrong-token")
        assert not caught.value.rejected


async def _wait_for(url: str, matchers: list[str], want: bool, within_s: float) -> list[Alert]:
    deadline = time.monotonic() + within_s
    while True:
        alerts = await active_alerts(url, matchers)
        if bool(alerts) == want or time.monotonic() > deadline:
            return alerts
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_pushed_alert_is_seen_by_matching_matchers_until_resolved(am: Server) -> None:
    labels = {"alertname": "GPUDown", "severity": "page", "gpu": "3"}
    push_alert(am.url, labels, annotations={"summary": "GPU 3 fell off the bus"})
    seen = await active_alerts(am.url, ['alertname="GPUDown"', 'severity=~"critical|page"'])
    assert [(a.labels, a.annotations["summary"], a.state) for a in seen] == [(labels, "GPU 3 fell off the bus",
                                                                              "active")]
    assert seen[0].starts_at == pytest.approx(time.time(), abs=10)
    assert await active_alerts(am.url, [parse_matcher('gpu = "3"'), Matcher("alertname", "=", "GPUDown")]) == seen
    assert await active_alerts(am.url, ['alertname="GPUDown"', 'severity="critical"']) == []
    assert await active_alerts(am.url, ['alertname="GPUDown"', "gpu!=3"]) == []
    assert await active_alerts(am.url, ['severity=~"pa"']) == []  # anchored: "pa" is not "page"
    resolve_alert(am.url, labels)
    assert await _wait_for(am.url, ['alertname="GPUDown"'], want=False, within_s=5) == []


@pytest.mark.slow
async def test_a_bad_matcher_is_rejected_with_alertmanagers_words(am: Server) -> None:
    with pytest.raises(FleetSignalError, match="bad matcher format") as caught:
        await active_alerts(am.url, ["severity"])
    assert caught.value.rejected and f"{am.url}/api/v2/alerts" in str(caught.value)
    with pytest.raises(FleetSignalError, match="regexp") as caught:
        await active_alerts(am.url, ['severity=~"("'])
    assert caught.value.rejected
