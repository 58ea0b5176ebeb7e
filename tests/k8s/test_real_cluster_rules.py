"""What a real 1.36 cluster was seen to do, as the fake's rules and the product's answers to it, without
a cluster: the kubelet's CrashLoopBackOff timing, which first process a SIGTERM reaches, a malformed
selector as a 400, and when start-up stops retrying a 5xx the API server gives every attempt."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from fake_apiserver import CRASH_BACKOFF, KIND, ApiError, PodRuntime, crash_wait, handles_sigterm, object_filter

from chaos.k8s.errors import SERVER_ERROR_ATTEMPTS, SERVER_ERROR_SPAN_S, Call, ServerErrors, refusal
from chaos.model.errors import SetupFailed

pytestmark = pytest.mark.timeout(30)


def test_a_crashed_container_restarts_at_once_then_after_10_20_40_s_up_to_300() -> None:
    """A real kubelet: the first crash restarts at once, then ~10 s and ~20 s, doubling, capped at 300 s;
    a container that ran 10 minutes starts from the beginning again."""
    pod: dict[str, Any] = {"metadata": {}}
    runtime = PodRuntime(ip="127.0.0.1", log=None)  # type: ignore[arg-type]
    waits = [crash_wait(runtime, pod, now=100.0) for _ in range(8)]
    assert waits == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert crash_wait(runtime, pod, now=700.0) == 0.0  # it ran from 0 to 700 s: back to a restart at once
    runtime.started_at = 700.0
    assert crash_wait(runtime, pod, now=701.0) == 10.0
    fast = {"metadata": {"annotations": {CRASH_BACKOFF: "0.5"}}}  # what a test sets to keep its time flat
    quick = PodRuntime(ip="x", log=None)  # type: ignore[arg-type]
    assert [crash_wait(quick, fast, 1.0) for _ in range(3)] == [0.0, 0.5, 1.0]


def test_only_a_first_process_that_handles_sigterm_is_sent_it() -> None:
    """A container's first process is PID 1 of its namespace: without a handler SIGTERM does nothing to
    it. The fake reads the handler from /proc/PID/status (SigCgt)."""
    code = ("import signal, sys, time\n"
            "if sys.argv[1] == 'handled': signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            "print('up', flush=True); time.sleep(30)\n")
    children = {how: subprocess.Popen([sys.executable, "-c", code, how], stdout=subprocess.PIPE)
                for how in ("handled", "plain")}
    try:
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert handles_sigterm(children["handled"].pid) is True
        assert handles_sigterm(children["plain"].pid) is False
    finally:
        for child in children.values():
            child.kill()
            child.wait(5)
    assert handles_sigterm(children["plain"].pid) is True  # gone: nothing to read, the signal is sent as before


@pytest.mark.parametrize(("labels", "fields"), [
    ("app=a b", None), ("app=web,", None), ("bad key!=x", None), ("app in (a b)", None), ("n>x", None),
    (None, "status.phase"), (None, "spec.nothing=1")])
def test_a_malformed_selector_is_a_400_not_an_empty_match(labels: str | None, fields: str | None) -> None:
    query = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v is not None}
    with pytest.raises(ApiError) as bad:
        object_filter(KIND["pods"], query)
    assert bad.value.code == 400 and bad.value.reason == "BadRequest"


def test_well_formed_selectors_select_as_the_api_server_does() -> None:
    pod = {"metadata": {"name": "web-1", "labels": {"app": "web", "tier": "1"}}, "status": {"phase": "Running"}}

    def selects(**query: str) -> bool:
        return object_filter(KIND["pods"], query)(pod)

    assert selects(labelSelector="app=web,tier in (1, 2),!gone", fieldSelector="metadata.name=web-1")
    assert selects(labelSelector="tier>0") and not selects(labelSelector="tier<1")
    assert not selects(fieldSelector="status.phase!=Running") and selects(labelSelector="", fieldSelector="")


def test_the_clients_answer_to_a_400_and_a_5xx_quotes_the_server() -> None:
    call = Call("list", "pods", "demo")
    bad = refusal(400, b'{"kind":"Status","reason":"BadRequest","code":400,"message":"unable to parse requirement: '
                  b'x"}', call, error=SetupFailed)
    assert str(bad) == ("the API server rejected list pods in namespace demo as a bad request "
                        "(400 BadRequest: unable to parse requirement: x)")
    failed = refusal(500, b'{"kind":"Status","reason":"InternalError","code":500,"message":"Internal error occurred:'
                     b' no preferred addresses found; known addresses: []"}',
                     Call("create", "pods/portforward", "demo", "web-1"), error=SetupFailed)
    assert str(failed) == ("the API server failed to create pods/portforward web-1 in namespace demo: HTTP 500 "
                           "InternalError (Internal error occurred: no preferred addresses found; known addresses: [])")


def test_start_up_gives_up_on_a_5xx_that_lasts_and_not_on_one_that_passes() -> None:
    five = refusal(500, b'{"message": "no preferred addresses found"}', Call("create", "pods/portforward", "d", "w"),
                   error=SetupFailed)
    other = refusal(403, b"{}", Call("get", "services", "d", "w"), error=SetupFailed)
    errors = ServerErrors()
    now, pauses = 0.0, []
    while not errors.failed(five, now):
        pauses.append(errors.pause_s(0.5))
        now += pauses[-1]
    assert errors.attempts >= SERVER_ERROR_ATTEMPTS and now >= SERVER_ERROR_SPAN_S
    assert pauses == [0.5, 1.0, 2.0, 4.0] and now < 10  # spaced out, and over in seconds (908 tries before)
    given_up = errors.given_up(five)
    assert isinstance(given_up, SetupFailed) and getattr(given_up, "http_status", None) == 500
    assert "HTTP 500" in str(given_up) and "no preferred addresses found" in str(given_up)
    assert f"each of {errors.attempts} consecutive attempts over 7.5s" in str(given_up)
    # a 5xx between other failures (a pod still starting, a refusal) starts the count again
    again = ServerErrors()
    for t in range(20):
        assert not again.failed(five if t % 3 else None, float(t))
        assert not again.failed(other, float(t))
    assert again.pause_s(0.5) == 0.5
