"""The Chaos Toolkit extension (integrations/chaostoolkit, module chaosstreamchaos), run by the real
`chaos run` of chaostoolkit on experiment files written here, against real builtin stacks: a healthy
stack meets the steady-state hypothesis, a stack with a planted KV leak deviates, an inconclusive
verdict fails the tolerance too, and a background load and fault stopped by the rollbacks leave nothing
running. `chaos discover` lists the activities from the package as pip installs it.

One healthy stack and one CTK run of the disconnect storm serve the module (each streamchaos run is
~10 s): the inconclusive case re-judges that same run."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("chaoslib")

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "integrations" / "chaostoolkit"
sys.path.insert(0, str(EXTENSION))

from chaoslib.exceptions import ActivityFailed
from chaoslib.hypothesis import within_tolerance
from chaosstreamchaos import actions, discover, probes

from chaos.stack.process import StackProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CTK = Path(sys.executable).with_name("chaos")  # chaostoolkit's CLI, beside this interpreter (the venv's bin/)
PLANTED = ROOT / "tests" / "e2e" / "planted_stack.py"

# Every client hangs up 2 tokens into its 600-token stream for 2 s (tests/e2e/test_planted_defects.py's
# leak experiment): a stack that never aborts keeps their KV blocks (kv_cleanup fails: measured 5.3 s
# against 1 s), a healthy one frees them (35-120 ms). Before it, 1 s of plain load gives ~6 TTFTs: too
# few to bound a p99 (368 needed), so `tail` is inconclusive on any stack (the run exits 3).
STORM = {
    "name": "ctk-storm", "seed": 3,
    "target": {"kind": "openai", "model": "tiny"},
    "load": {"concurrency": 6, "max_tokens": 600, "request_timeout": "20s"},
    "phases": [
        {"name": "warmup", "duration": "1s"},
        {"name": "storm", "duration": "2s",
         "faults": [{"kind": "client.disconnect", "fraction": "100%", "after_tokens": 2}]},
    ],
    "sla": [
        {"kind": "kv_cleanup", "within": "1s"},
        {"kind": "ttft", "name": "tail", "phases": ["warmup"], "quantile": "p99", "budget": "1s"},
    ],
    "safety": {"max_duration": "90s", "cleanup_window": "2s", "drain_timeout": "3s"},
}


def python(func: str, **arguments: Any) -> dict[str, Any]:
    module = "chaosstreamchaos.probes" if func in probes.__all__ else "chaosstreamchaos.actions"
    return {"type": "python", "module": module, "func": func, "arguments": arguments}


def probe(name: str, func: str, tolerance: Any = True, **arguments: Any) -> dict[str, Any]:
    return {"type": "probe", "name": name, "tolerance": tolerance, "provider": python(func, **arguments)}


def action(name: str, func: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "action", "name": name, "provider": python(func, **arguments)}


def ctk_experiment(configuration: dict[str, Any], method: list[dict[str, Any]],
                   hypothesis: list[dict[str, Any]] | None = None,
                   rollbacks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    experiment: dict[str, Any] = {
        "version": "1.0.0", "title": "streamchaos under the Chaos Toolkit", "description": "tests/integrations",
        "configuration": configuration,
        # the verdicts exist only once the method's run has ended: the hypothesis is judged after it
        "runtime": {"hypothesis": {"strategy": "after-method-only"}, "rollbacks": {"strategy": "always"}},
        "method": method,
        "rollbacks": rollbacks or [],
    }
    if hypothesis:
        experiment["steady-state-hypothesis"] = {"title": "the run's SLAs held", "probes": hypothesis}
    return experiment


def chaos_run(experiment: dict[str, Any], where: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                                            dict[str, Any]]:
    """`chaos run` of chaostoolkit in ``where``: its process and its journal.json."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "experiment.json").write_text(json.dumps(experiment, indent=2), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXTENSION), str(ROOT)])}
    proc = subprocess.run([str(CTK), "--no-version-check", "run", "experiment.json", *extra], cwd=where, env=env,
                          capture_output=True, text=True, timeout=150)
    journal = json.loads((where / "journal.json").read_text(encoding="utf-8"))
    return proc, journal


def storm_under_ctk(url: str, where: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The storm run by the method's run_experiment; the hypothesis: kv_cleanup passed in that run (by
    bool and by verdict), and the stack's KV cache is back at rest."""
    (where / "storm.yaml").parent.mkdir(parents=True, exist_ok=True)
    (where / "storm.yaml").write_text(yaml.safe_dump(STORM), encoding="utf-8")
    experiment = ctk_experiment(
        {"run_dir": str(where / "run"), "target_url": url},
        method=[action("disconnect-storm", "run_experiment", path=str(where / "storm.yaml"),
                       target_url="${target_url}", out_dir="${run_dir}")],
        hypothesis=[
            probe("kv-cleanup-passed", "sla_passed", run_dir="${run_dir}", sla="kv_cleanup"),
            probe("kv-cleanup-verdict", "sla_verdict", ["pass"], run_dir="${run_dir}", sla="kv_cleanup"),
            probe("kv-at-rest", "kv_back_to_baseline", metrics_url="${target_url}/metrics", within_s=5),
        ],
    )
    return chaos_run(experiment, where)


def hypothesis_after(journal: dict[str, Any]) -> list[dict[str, Any]]:
    return list(journal["steady_states"]["after"]["probes"])


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start("--port", "0") as stack:
        yield stack


@pytest.fixture(scope="module")
def storms(stack: StackProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]]:
    """The same CTK experiment against the healthy stack and against one with a planted KV leak, side by
    side: two `chaos run`s at once (each verdict decides with margin: a healthy stack frees its blocks in
    35-120 ms against a 1 s budget, the leaky one never), in half the wall time of one after the other."""
    healthy, leaky = tmp_path_factory.mktemp("healthy"), tmp_path_factory.mktemp("leaky")
    with StackProcess.start(command=[sys.executable, str(PLANTED), "--defect", "leak", "--port", "0",
                                     "--max-num-seqs", "64"], timeout=60) as leaky_stack, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {name: pool.submit(storm_under_ctk, url, where)
                for name, url, where in (("healthy", stack.url, healthy), ("leaky", leaky_stack.url, leaky))}
        done = {name: run.result() for name, run in runs.items()}
    return {"healthy": (*done["healthy"], healthy / "run"), "leaky": (*done["leaky"], leaky / "run")}


@pytest.fixture(scope="module")
def healthy_storm(storms: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    healthy: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path] = storms["healthy"]
    return healthy


def test_a_healthy_stack_meets_the_hypothesis(healthy_storm: Any) -> None:
    proc, journal, run_dir = healthy_storm
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert journal["status"] == "completed" and journal["deviated"] is False
    storm = journal["run"][0]
    assert storm["status"] == "succeeded", storm
    # the run exits 3 (its `tail` cannot be decided): the action returns it, the probes judge it
    out = storm["output"]
    assert (out["exit_code"], out["status"], out["run_dir"], out["run_status"]) == (3, "inconclusive", str(run_dir),
                                                                                     "completed")
    by_name = {v["name"]: v for v in out["verdicts"]}
    assert by_name["kv_cleanup"]["status"] == "pass" and by_name["tail"]["status"] == "inconclusive"
    assert "samples" in by_name["tail"]["reason"] and set(by_name["kv_cleanup"]) >= {
        "sla", "phase", "status", "figure", "budget", "unit"}
    after = hypothesis_after(journal)
    assert [p["tolerance_met"] for p in after] == [True, True, True], after
    assert after[0]["output"] is True and after[1]["output"]["status"] == "pass" and after[2]["output"] is True
    assert journal["steady_states"]["before"] is None  # after-method-only: nothing to judge before the run


def test_a_planted_kv_leak_deviates(storms: dict[str, Any]) -> None:
    """The same CTK experiment against a stack that never aborts a departed client's request: kv_cleanup
    fails in the run (exit 1, returned, not raised), the probe is outside its tolerance, CTK deviates."""
    proc, journal, _ = storms["leaky"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert journal["deviated"] is True and journal["status"] == "completed"
    out = journal["run"][0]["output"]
    assert (out["exit_code"], out["status"]) == (1, "fail")
    assert {v["name"]: v["status"] for v in out["verdicts"]}["kv_cleanup"] == "fail"
    first = hypothesis_after(journal)[0]
    assert first["status"] == "succeeded" and first["output"] is False and first["tolerance_met"] is False
    assert journal["steady_states"]["after"]["steady_state_met"] is False


def test_an_inconclusive_verdict_fails_the_tolerance(healthy_storm: Any, tmp_path: Path) -> None:
    """The healthy run's `tail` could not be decided: `sla_passed` is False and CTK deviates, exactly as
    for a failed SLA; `sla_verdict` says inconclusive, outside a ["pass"] tolerance too."""
    _, _, run_dir = healthy_storm
    experiment = ctk_experiment(
        {"run_dir": str(run_dir)},
        method=[{"type": "probe", "name": "run-passed", "provider": python("run_passed", run_dir="${run_dir}")}],
        hypothesis=[probe("tail-passed", "sla_passed", run_dir="${run_dir}", sla="tail")],
    )
    proc, journal = chaos_run(experiment, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert journal["deviated"] is True
    assert journal["run"][0]["output"] is False  # exit 3 is not a passing run
    tail = hypothesis_after(journal)[0]
    assert tail["output"] is False and tail["tolerance_met"] is False
    verdict = probes.sla_verdict(str(run_dir), "tail")
    assert verdict["status"] == "inconclusive" and verdict["phase"] == "warmup"
    assert within_tolerance(["pass"], verdict) is False
    assert within_tolerance(["pass"], probes.sla_verdict(str(run_dir), "kv_cleanup")) is True


def test_background_load_and_fault_end_and_rollbacks_leave_nothing_running(stack: StackProcess,
                                                                           tmp_path: Path) -> None:
    """The method starts load (60 s) and a fault run (0.5 s baseline, 1 s client.disconnect) on the stack and
    waits for the fault run; the rollbacks stop both: the load with one SIGTERM, the fault run (ended)
    untouched, the load again a no-op. No process of either run is left, and the stack's KV is at rest."""
    load_dir, fault_dir = tmp_path / "load", tmp_path / "fault"
    small = {"concurrency": 2, "max_tokens": 32}
    experiment = ctk_experiment(
        {"load_dir": str(load_dir), "fault_dir": str(fault_dir), "target_url": stack.url},
        method=[
            action("load", "start_load", target_url="${target_url}", out_dir="${load_dir}", duration="60s", load=small),
            action("hangups", "inject_fault", target_url="${target_url}", out_dir="${fault_dir}", load=small,
                   fault={"kind": "client.disconnect", "fraction": "50%", "after_tokens": 2},
                   baseline="500ms", duration="1s", recovery="0s"),
            action("hangups-end", "wait_run", run_dir="${fault_dir}", timeout_s=60),
        ],
        rollbacks=[action(f"stop-{name}", "stop_run", run_dir=f"${{{name}_dir}}")
                   for name in ("fault", "load", "load")],
    )
    proc, journal = chaos_run(experiment, tmp_path / "ctk")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started, faulted, waited = (run["output"] for run in journal["run"])
    assert started["running"] is True and faulted["running"] is True and started["pid"] != faulted["pid"]
    assert (waited["exit_code"], waited["status"]) == (0, "pass"), waited
    assert {v["phase"] for v in waited["verdicts"]} <= {None, "baseline", "fault"}
    stop_fault, stop_load, again = (run["output"] for run in journal["rollbacks"])
    assert stop_fault["stopped"] is False and stop_fault["exit_code"] == 0  # it had ended: left as it was
    assert stop_load["stopped"] is True and stop_load["killed"] is False
    assert (stop_load["exit_code"], stop_load["run_status"]) == (4, "interrupted")
    assert again["stopped"] is False and again["exit_code"] == 4  # idempotent
    for run_dir, pid in ((load_dir, started["pid"]), (fault_dir, faulted["pid"])):
        record = json.loads((run_dir / "chaostoolkit.json").read_text())
        assert record["pid"] == pid
        assert any(json.loads(line).get("type") == "end" for line in (run_dir / "journal.jsonl").open("rb"))
        assert not Path(f"/proc/{pid}").exists()
    assert not [pid for pid, cmd in processes() if str(load_dir) in cmd or str(fault_dir) in cmd]
    assert probes.kv_back_to_baseline(stack.metrics_url, within_s=10)


def processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue


ACTIONS = {"run_experiment", "start_load", "inject_fault", "wait_run", "stop_run"}
PROBES = {"sla_verdict", "sla_passed", "run_passed", "kv_back_to_baseline"}


def test_chaos_discover_lists_the_activities_of_the_installed_package(tmp_path: Path) -> None:
    """pip builds and installs the package (offline, into a folder of its own), and `chaos discover
    --no-install` finds it by its distribution name; discover() in-process says the same."""
    source = tmp_path / "src"
    shutil.copytree(EXTENSION, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(site), str(source)], check=True, capture_output=True,
                   timeout=120)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([str(CTK), "--no-version-check", "discover", "chaostoolkit-streamchaos", "--no-install",
                           "--discovery-path", str(tmp_path / "discovery.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads((tmp_path / "discovery.json").read_text())
    assert found["extension"] == {"name": "chaostoolkit-streamchaos", "version": "0.1.0"}
    assert {a["name"] for a in found["activities"] if a["type"] == "action"} == ACTIONS
    assert {a["name"] for a in found["activities"] if a["type"] == "probe"} == PROBES
    assert {a["mod"] for a in found["activities"]} == {"chaosstreamchaos.actions", "chaosstreamchaos.probes"}
    assert "client.disconnect" in found["system"]["faults"] and "kv_cleanup" in found["system"]["slas"]

    local = discover(discover_system=False)
    assert local["system"] is None
    by_name = {a["name"]: a for a in local["activities"]}
    assert set(by_name) == ACTIONS | PROBES
    args = {name: {arg["name"]: arg for arg in a["arguments"]} for name, a in by_name.items()}
    assert list(args["run_experiment"]) == ["path", "target_url", "out_dir", "timeout_s", "configuration", "secrets"]
    assert list(args["sla_passed"]) == ["run_dir", "sla", "phase"] and args["sla_passed"]["phase"]["default"] is None
    assert args["kv_back_to_baseline"]["series"]["default"] == "vllm:kv_cache_usage_perc"
    assert args["inject_fault"]["fault"]["type"] == "mapping" and args["run_passed"]["run_dir"]["type"] == "string"
    assert by_name["sla_passed"]["return_type"] == "boolean" and by_name["sla_verdict"]["return_type"] == "mapping"
    assert all(a["doc"] for a in local["activities"])


# -- the probes on a report.json written here, and the actions' refusals: no chaos run needed --------

def write_report(run_dir: Path, exit_code: int, verdicts: list[dict[str, Any]]) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.json").write_text(json.dumps({"status": "completed", "exit_code": exit_code,
                                                     "verdicts": verdicts}))
    return str(run_dir)


def verdict(sla: str, status: str, phase: str | None = None, name: str | None = None, **more: Any) -> dict[str, Any]:
    return {"sla": sla, "name": name or sla, "phase": phase, "status": status, "figure": 0.1, "budget": 0.2,
            "unit": "s", "samples": 40, "evidence": {"n": 40}, "expect": "pass", "ok": status == "pass", **more}


def test_only_a_pass_passes(tmp_path: Path) -> None:
    run_dir = write_report(tmp_path / "run", 3, [
        verdict("ttft", "pass", "baseline"), verdict("ttft", "inconclusive", "storm"),
        verdict("errors", "fail"), verdict("kv_cleanup", "unobservable", when_unobservable="tolerate", ok=True),
        verdict("itl", "pass", name="itl_storm"),
    ])
    assert probes.sla_passed(run_dir, "ttft", phase="baseline") is True
    assert probes.sla_passed(run_dir, "ttft", phase="storm") is False
    assert probes.sla_passed(run_dir, "ttft") is False  # the worst of its phases
    assert probes.sla_verdict(run_dir, "ttft")["status"] == "inconclusive"
    assert probes.sla_passed(run_dir, "errors") is False
    assert probes.sla_passed(run_dir, "kv_cleanup") is False  # tolerated for the exit code, not a pass
    assert probes.sla_passed(run_dir, "itl_storm") is True and probes.sla_passed(run_dir, "itl") is True
    assert probes.sla_passed(run_dir, "nope") is False and probes.sla_passed(str(tmp_path / "none"), "ttft") is False
    assert "evidence" not in probes.sla_verdict(run_dir, "errors")
    with pytest.raises(ActivityFailed, match=r"no verdict for SLA 'nope'.*ttft \(ttft, phase storm\)"):
        probes.sla_verdict(run_dir, "nope")
    with pytest.raises(ActivityFailed, match="no report.json"):
        probes.sla_verdict(str(tmp_path / "none"), "ttft")
    assert probes.run_passed(run_dir) is False
    assert probes.run_passed(write_report(tmp_path / "ok", 0, [verdict("ttft", "pass")])) is True
    assert probes.run_passed(str(tmp_path / "none")) is False


def test_an_invalid_experiment_fails_the_action(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**STORM, "load": {"concurrency": "many"}}), encoding="utf-8")
    with pytest.raises(ActivityFailed, match=r"exited 2 \(invalid\).*concurrency"):
        actions.run_experiment(str(bad), target_url="http://127.0.0.1:9", out_dir=str(tmp_path / "run"))
    with pytest.raises(ActivityFailed, match="a mapping with a kind"):
        actions.inject_fault({"fraction": "50%"})
    with pytest.raises(ActivityFailed, match="duration"):
        actions.inject_fault({"kind": "client.disconnect"}, duration="ten seconds")


def test_stop_run_of_a_directory_with_no_run_is_a_no_op(tmp_path: Path) -> None:
    stopped = actions.stop_run(str(tmp_path / "never"))
    assert (stopped["stopped"], stopped["killed"], stopped["pid"], stopped["exit_code"]) == (False, False, None, None)
    with pytest.raises(ActivityFailed, match="no streamchaos run was started there"):
        actions.wait_run(str(tmp_path / "never"))


def test_kv_back_to_baseline_is_false_for_an_absent_series(stack: StackProcess) -> None:
    assert probes.kv_back_to_baseline(stack.metrics_url, series="vllm:no_such_series", within_s=0.3) is False
    assert probes.kv_back_to_baseline("http://127.0.0.1:9/metrics", within_s=0.3) is False
    assert probes.kv_back_to_baseline(stack.metrics_url, within_s=2) is True


def test_the_core_packages_never_import_the_chaos_toolkit() -> None:
    """The extension imports streamchaos, never the other way round: installing streamchaos stays
    without chaostoolkit-lib."""
    import ast

    found = []
    for package in ("chaos", "faults", "sla"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in ("chaoslib", "chaostoolkit", "chaosstreamchaos")]
    assert found == []


def descendants(pid: int) -> set[int]:
    """The processes under ``pid`` (by /proc's parent ids)."""
    parents = {}
    for child, _ in processes():
        try:
            parents[child] = int((Path("/proc") / str(child) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    out: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        kids = {c for c, p in parents.items() if p == parent} - out
        out |= kids
        todo += kids
    return out


def test_a_run_that_outlasts_stop_run_is_killed_and_rolled_back(stack: StackProcess, tmp_path: Path) -> None:
    """stop_run is bounded: a run not gone `timeout_s` after its SIGTERM (0 here) is killed, its journal
    rolled back (`streamchaos rollback`), and its own processes (the load's) go with it."""
    started = actions.start_load(target_url=stack.url, out_dir=str(tmp_path / "run"), duration="60s",
                                 load={"concurrency": 2, "max_tokens": 32})
    under = descendants(started["pid"])
    stopped = actions.stop_run(started["run_dir"], timeout_s=0.0)
    assert stopped["stopped"] is True and stopped["killed"] is True, stopped
    assert stopped["exit_code"] == -9 and stopped["status"] == "killed" and stopped["rollback_exit_code"] == 0
    for pid in {started["pid"], *under}:
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), pid
    assert actions.stop_run(started["run_dir"])["stopped"] is False
