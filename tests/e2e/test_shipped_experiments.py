"""Every shipped experiment runs green against the builtin stack, through the pytest plugin's
``chaos_run`` fixture, and the network experiments show the effect their fault is meant to have."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.execution.verify import CLIENT_SATURATED, HOST_CHANGED, HOST_SATURATED
from chaos.model.observations import Observations
from chaos.pytest_plugin import failure_message

ROOT = Path(__file__).parents[2]
# The shipped experiments this module cannot run, by target kind, and the test file that runs each:
# kind kubernetes against the fake API server (or a real cluster), kind vllm against real vLLM.
RUN_ELSEWHERE = {
    "kubernetes": "tests/k8s/runs/test_pod_kill_experiment.py",
    "vllm": "tests/vllm/test_vllm_target.py",
}


# ... and by name: ttft-tail's healthy p99 needs ~480 TTFTs worth independent ones, which a busy 2-core
# box running three test workers cannot collect within its 2-minute phase (exit 3, measured at load 6.8;
# an idle box decides it at the first look, 20 s). The planted-tail test runs it, decided fail.
RUN_ELSEWHERE_BY_NAME = {
    "ttft-tail.yaml": "tests/e2e/test_planted_tail.py",
    # regressions of engines we did not write: run against the affected server and its fixed configuration
    "llamacpp-keep-alive.yaml": "tests/llamacpp/test_llama_server.py",
    "llama-cpp-python-interrupt.yaml": "tests/thirdparty/test_llama_cpp_python.py",
}


def _runs_elsewhere(path: Path) -> str | None:
    """The test file that runs this shipped experiment, where that is not this module; else None."""
    kind = (yaml.safe_load(path.read_text(encoding="utf-8")).get("target") or {}).get("kind")
    return RUN_ELSEWHERE.get(kind) or RUN_ELSEWHERE_BY_NAME.get(path.name)


SHIPPED = sorted((ROOT / "experiments").glob("*.yaml"))
EXPERIMENTS = [p for p in SHIPPED if _runs_elsewhere(p) is None]

pytestmark = pytest.mark.timeout(240)


def ms(values: list[int]) -> list[float]:
    return [v / 1e6 for v in values]


def ttfts(obs: Observations, phase: str) -> list[float]:
    return ms([s.ttft_ns for s in obs.population(phase) if s.ttft_ns is not None])


def gaps(obs: Observations, phase: str) -> list[float]:
    return ms([g for s in obs.population(phase) for g in s.gaps_ns])


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def check_network_jitter(result: Any) -> None:
    """100ms ± 50ms of downstream latency moves TTFT by about 100ms and widens the gaps."""
    obs = result.observations
    shift = statistics.median(ttfts(obs, "jitter")) - statistics.median(ttfts(obs, "baseline"))
    assert 50 <= shift <= 300, f"TTFT median shift {shift:.1f}ms, injected 100ms ± 50ms"
    # Each chunk gets its own delay in [50ms, 150ms) and order is kept, so within a stream some gaps
    # widen by up to the jitter's range. The gap p99 over all streams is dominated by rare stalls
    # of the 2-core VM (baseline p99 ranged 12-41ms over runs); each stream's longest gap is not.
    longest = {phase: statistics.median(max(s.gaps_ns) / 1e6 for s in obs.population(phase) if len(s.gaps_ns) > 1)
               for phase in ("baseline", "jitter")}
    # A busy box stretches the baseline's longest gaps too (a CI run of three workers: 28 ms, the jitter
    # phase's 53 ms; a busier one: 37 ms and 54 ms), so the widening is asked in milliseconds, not as a
    # ratio of a baseline the box sets. Latency without jitter keeps each stream's gaps: no widening.
    widening = longest["jitter"] - longest["baseline"]
    assert 10 <= widening <= 150, f"longest gap per stream (median): {longest}"


def check_tiny_packets(result: Any) -> None:
    """The slicer really split multibyte characters across reads, and integrity still passed."""
    integrity = next(v for v in result.verdicts if v.sla == "integrity")
    assert integrity.status == "pass"
    assert integrity.evidence["split_chars"] > 0
    assert sum(s.read_count for s in result.observations.streams) > 10 * len(result.observations.streams)


def check_connection_resets(result: Any) -> None:
    cut = [v for v in result.verdicts if v.sla == "early_close" and v.phase == "resets"]
    assert cut and cut[0].status == "fail" and cut[0].figure > 0


def check_buffering_proxy(result: Any) -> None:
    """With the buffer toxic the first content arrives with the last: TTFT ≈ end-to-end latency."""
    ttft = next(v for v in result.verdicts if v.sla == "ttft")
    assert ttft.status == "fail"
    reverted = next(e.t for e in result.observations.faults if e.action == "revert")
    held = [s for s in result.observations.population() if s.t_end is not None and s.t_end < reverted]
    assert held
    for s in held:  # streams that ended while the buffer was in force
        assert s.t_first_content is not None and s.t_content and s.t_sent is not None
        # every token in one burst: parsing it took 7-43 ms against waits of 520-770 ms on a loaded box;
        # streamed unbuffered, the first token comes early and the rest span many times that wait
        burst, wait = s.t_content[-1] - s.t_first_content, s.t_first_content - s.t_sent
        assert burst < 0.25 * wait, (burst, wait)


def check_client_timeouts(result: Any) -> None:
    # the healthy stack aborts the requests whose client's read timed out: the control of
    # tests/e2e/test_planted_cleanup.py's orphans_on_timeout server, which fails this verdict
    aborts = next(v for v in result.verdicts if v.sla == "abort_propagation" and v.phase == "impatient")
    assert aborts.status == "pass", aborts.evidence
    assert aborts.evidence["clients_left"].get("read timeout", 0) > 10, aborts.evidence


def check_disconnect_storm(result: Any) -> None:
    kinds = {v.sla for v in result.verdicts}
    assert {"ttft", "early_close", "kv_cleanup", "abort_propagation"} <= kinds
    assert any(s.hangup is not None for s in result.observations.streams)
    # the stack aborts every hung-up request: the running gauge never outnumbers the open streams for long
    aborts = next(v for v in result.verdicts if v.sla == "abort_propagation")
    assert aborts.status == "pass" and aborts.samples >= 20, aborts.evidence


def check_event_loop_stall(result: Any) -> None:
    """Every stream stalls at once: the longest gap under the fault is about the stall length."""
    longest = {v.phase: v.evidence["longest_stall_s"] for v in result.verdicts if v.name in ("itl", "itl_outside")}
    assert longest["stalls"] >= 0.12, longest
    stalled = {phase: sum(1 for g in gaps(result.observations, phase) if g >= 120)
               for phase in ("baseline", "stalls", "recovery")}
    # 5 stalls hit every stream in flight; a stall left in force after the revert would stall recovery as
    # often, per second, as it did the stalls phase. A box that takes the CPU makes such gaps too (CI runs
    # beside two busy processes and the suite: 4 in the 3 s baseline, 9 in the 3 s recovery, 16 in the
    # stalls; and 0, 7 and 24), so recovery is judged against the baseline, which lasts as long, or at
    # most 60% of the stalls phase's rate
    seconds = {phase: _phase_seconds(result.observations, phase) for phase in stalled}
    rates = {phase: stalled[phase] / seconds[phase] for phase in stalled}
    assert stalled["stalls"] >= 5, (stalled, seconds)
    assert (stalled["recovery"] <= max(4, 3 * stalled["baseline"])
            or rates["recovery"] <= 0.6 * rates["stalls"]), (stalled, seconds)


def _phase_seconds(obs: Observations, phase: str) -> float:
    window = obs.phase(phase)
    assert window is not None and window.t_end is not None, phase
    return (window.t_end - window.t_start) / 1e9


def check_kv_pressure(result: Any) -> None:
    """The reservation drove real queueing or preemption, recorded from the stack's metrics."""
    obs = result.observations
    window = obs.phase("pressure")
    assert window is not None and window.t_end is not None
    during = [m for m in obs.metrics if window.t_start <= m.t <= window.t_end]
    waiting = max((m.value for m in during if m.name == "vllm:num_requests_waiting"), default=0)
    preempted = [m.value for m in obs.series("vllm:num_preemptions_total")]
    assert waiting > 0 or (preempted and preempted[-1] > preempted[0]), (waiting, preempted[:1], preempted[-1:])


def check_server_timeouts(result: Any) -> None:
    """Each injected timeout became an in-band error followed by [DONE]: nothing hung."""
    failed = [s for s in result.observations.population() if s.in_band_error is not None]
    assert failed and all(s.done_seen for s in failed)
    assert not [s for s in result.observations.population() if s.error is not None and s.error.kind == "timeout"]


def check_gpu_throttle(result: Any) -> None:
    """The report says which backend acted and why (auto on a CPU machine picks a CPU backend)."""
    injects = [e for e in result.observations.faults if e.action == "inject"]
    assert injects and injects[0].evidence["backend"] in ("nvml", "contention", "cpu_duty") \
        and injects[0].evidence.get("why")


def check_engine_crash(result: Any) -> None:
    """The kill cut streams in the crash phase, the stack came back, and recovery was clean."""
    assert any(n.topic == "target" and n.data.get("restarted") for n in result.observations.notes)
    crash = [s for s in result.observations.population("crash") if not s.complete]
    assert crash


def _report(result: Any) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads((result.out_dir / "report.json").read_text(encoding="utf-8"))
    return data


def check_conversations_under_kv_pressure(result: Any) -> None:
    """Every later turn resent its history (usage grows turn over turn: context_kept passed); the pressure
    evicted cached prefixes, so the hit rate fell in its phase and came back after (measured 83% → 58% →
    83%); report.json gives per-turn TTFT for every phase."""
    report = _report(result)
    rates = {phase: p["prefix_cache_hit_rate"] for phase, p in report["engine_phases"].items()}
    assert rates["pressure"] < rates["baseline"] and rates["pressure"] < rates["recovery"], rates
    rows = {(row["phase"], row["turn"]) for row in report["turns"]}
    assert {("baseline", 2), ("pressure", 2), ("recovery", 2)} <= rows, sorted(rows)
    later = [s for s in result.observations.population() if (s.turn or 0) >= 2]
    assert later and all(s.session is not None and s.workload == "sessions" for s in later)


def check_trace_replay_engine_kill(result: Any) -> None:
    """The trace's prompts were exact in the stack's tokenizer (usage says the planned length); the kill cut
    streams and emptied the prefix cache, which the trace's shared blocks fill again after the restart."""
    assert any(n.topic == "target" and n.data.get("restarted") for n in result.observations.notes)
    exact = [s for s in result.observations.streams if s.usage and s.usage.get("prompt_tokens") is not None]
    assert exact and all(s.prompt_tokens == s.usage["prompt_tokens"] for s in exact if s.usage)
    rates = {phase: p["prefix_cache_hit_rate"] for phase, p in _report(result)["engine_phases"].items()}
    assert rates["baseline"] > 0.3 and rates["recovery"] > 0.3, rates


def check_nagle(result: Any) -> None:
    """server.nagle really turned TCP_NODELAY off on the stack's live connections, read back from the
    sockets, and its revert turned it on again; ttft caught it only in the nagle phase."""
    inject = next(e for e in result.observations.faults if e.action == "inject")
    revert = next(e for e in result.observations.faults if e.action == "revert")
    assert inject.evidence["connections_nagle_on"] >= 1 \
        and inject.evidence["connections_nagle_on"] == inject.evidence["connections_open"]
    assert revert.evidence["after"]["nagle_on"] == 0 and revert.evidence["after"]["nagle_wanted"] is False
    status = {v.name or v.sla: v.status for v in result.verdicts if v.sla == "ttft"}
    assert status == {"ttft": "pass", "ttft_sees_nagle": "fail"}, status


def check_html_report(result: Any) -> None:
    """report.html: every plot drawn with data, a row per verdict, a block per injected fault."""
    import re

    page = (result.out_dir / "report.html").read_text(encoding="utf-8")
    plots = dict(re.findall(r'<figure class="plot" data-plot="([^"]+)" data-points="(\d+)">', page))
    assert {"timeline", "waterfall"} <= set(plots), sorted(plots)
    assert all(int(points) > 0 for points in plots.values()), plots
    assert page.count('<tr class="verdict"') == len(result.verdicts)
    for verdict in result.verdicts:
        assert f'data-sla="{verdict.name or verdict.sla}"' in page
    injected = {e.fault for e in result.observations.faults if e.action == "inject"}
    assert page.count('<div class="fault" ') == len({e.fault for e in result.observations.faults}) >= len(injected)
    assert "<script" not in page


def check_container_freeze(result: Any) -> None:
    """The daemon saw the container paused, with no CPU time used while frozen; requests sent into the
    freeze got nothing until it ended, then completed; the container is gone and its log kept."""
    from chaos.docker.containers import LABEL_RUN_DIR, docker_client

    events = {e.action: e for e in result.observations.faults if e.kind == "docker.pause"}
    assert events["inject"].evidence["paused"] is True and events["revert"].evidence["unpaused"] is True
    assert events["revert"].evidence["cpu_used_while_paused_ms"] == 0
    # the whole engine was frozen: nothing sent after the pause took effect got a token before the
    # phase's 2s were over (the unpause cannot come earlier), however loaded the machine
    window = result.observations.phase("freeze")
    frozen = [s for s in result.observations.population("freeze")
              if s.t_sent is not None and s.t_sent > events["inject"].t]
    assert frozen and all(s.t_first_content is not None and s.t_first_content >= window.t_start + 2_000_000_000
                          for s in frozen)
    assert "streamchaos stack ready" in (result.out_dir / "container.log").read_text()
    client = docker_client()
    try:
        assert client.containers.list(all=True, filters={"label": f"{LABEL_RUN_DIR}={result.out_dir.resolve()}"}) == []
    finally:
        client.close()


EXTRA: dict[str, Callable[[Any], None]] = {
    "container-freeze": check_container_freeze,
    "event-loop-stall": check_event_loop_stall,
    "kv-pressure": check_kv_pressure,
    "server-timeouts": check_server_timeouts,
    "gpu-throttle": check_gpu_throttle,
    "engine-crash": check_engine_crash,
    "network-jitter": check_network_jitter,
    "tiny-packets": check_tiny_packets,
    "connection-resets": check_connection_resets,
    "buffering-proxy": check_buffering_proxy,
    "disconnect-storm": check_disconnect_storm,
    "client-timeouts": check_client_timeouts,
    "nagle": check_nagle,
    "conversations-under-kv-pressure": check_conversations_under_kv_pressure,
    "trace-replay-engine-kill": check_trace_replay_engine_kill,
}


def box_noise_only(result: Any) -> bool:
    """Every verdict not as expected is an inconclusive the verdict code put down to this box:
    never a fail, never an inconclusive for want of samples (a real defect of the experiment)."""
    failing = result.failing()
    return result.status == "completed" and bool(failing) and all(
        v.status == "inconclusive"
        and v.evidence.get("inconclusive_cause") in (CLIENT_SATURATED, HOST_CHANGED, HOST_SATURATED)
        for v in failing)


def test_each_experiment_left_out_here_is_run_by_the_test_named_for_it() -> None:
    """pod-kill.yaml was left out here as "run in tests/k8s" while the test that ran it was never
    committed: nothing ran it. Each one left out must be named by the file that runs it."""
    elsewhere = {p.name: _runs_elsewhere(p) for p in SHIPPED if _runs_elsewhere(p) is not None}
    assert "pod-kill.yaml" in elsewhere
    for name, runner in elsewhere.items():
        assert runner is not None and (ROOT / runner).is_file(), f"{name}: {runner} is not there"
        assert f'"{name}"' in (ROOT / runner).read_text(encoding="utf-8"), f"{runner} does not run {name}"


def needs_docker(path: Path) -> bool:
    import yaml

    return (yaml.safe_load(path.read_text(encoding="utf-8")).get("target") or {}).get("kind") == "docker"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_experiment_runs_green(chaos_run: Callable[..., Any], path: Path) -> None:
    if needs_docker(path):
        sys.path.insert(0, str(Path(__file__).parents[1] / "containers"))
        from dockerd import docker_skip_reason

        reason = docker_skip_reason()
        if reason is not None:
            pytest.skip(f"no Docker here: {reason}")
    result = chaos_run(path)
    if not result.ok and box_noise_only(result):
        # the tool itself said the box, not the stack, decided it (a saturated load generator, a neighbour
        # that took the host between the phases compared, or a saturated host that bunched the events):
        # one more run, said in the log
        print(f"rerun: {path.stem} was inconclusive because of this box: {failure_message(result)}")
        result = chaos_run(path)
    if not result.ok:
        raise AssertionError(failure_message(result))
    assert result.status == "completed" and result.exit_code == 0
    assert (result.out_dir / "report.json").is_file() and (result.out_dir / "junit.xml").is_file()
    check_html_report(result)
    EXTRA.get(path.stem, lambda r: None)(result)
