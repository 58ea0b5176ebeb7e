"""Where a spawned vLLM may run: one CPU left to the load generator on CPU, the list a user names,
refusals that say what is wrong, and a guard that places the whole process tree it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.experiment import load_experiment
from chaos.host.cpuset import format_cpu_list, parse_cpu_list, server_cpus, validate_setting
from chaos.host.procguard import group_members
from chaos.model.errors import ExperimentInvalid

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_lists_parse_and_print_as_the_kernel_writes_them() -> None:
    assert parse_cpu_list("0-3, 8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list((11, 0, 1, 2, 8, 10)) == "0-2,8,10-11"
    assert format_cpu_list(parse_cpu_list("5")) == "5"
    for bad, says in (("3-1", "runs backwards: write 1-3"), ("0,x", "found 'x'"), ("", "found ''"),
                      ("1-9999", "beyond")):
        with pytest.raises(ValueError, match=says):
            parse_cpu_list(bad)


def test_auto_leaves_the_last_cpu_to_the_load_on_cpu_only() -> None:
    assert server_cpus("auto", "cpu", (0, 1)) == (0,)
    assert server_cpus("auto", "cpu", (2, 3, 4, 5)) == (2, 3, 4)
    assert server_cpus("auto", "cpu", (0,)) is None  # one CPU: nothing to leave
    assert server_cpus("auto", "cuda", (0, 1, 2, 3)) is None  # the model runs on the GPU
    assert server_cpus("all", "cpu", (0, 1)) is None
    assert server_cpus("1", "cpu", (0, 1)) == (1,)
    with pytest.raises(ValueError, match=r"names CPUs 4-5, which this process may not use \(allowed: 0-1\)"):
        server_cpus("0,4-5", "cpu", (0, 1))


def _write(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: x\ntarget: {target}\nphases: [{{name: a, duration: 1s}}]\n", encoding="utf-8")
    return path


def test_a_malformed_or_misplaced_cpus_is_refused_with_its_line(tmp_path: Path) -> None:
    assert validate_setting("auto") is None and validate_setting("0-1") is None
    with pytest.raises(ExperimentInvalid) as bad:
        load_experiment(_write(tmp_path, '{kind: vllm, cpus: "2-0"}'))
    assert "exp.yaml:2:" in str(bad.value) and "target.cpus" in str(bad.value) and "write 0-2" in str(bad.value)
    with pytest.raises(ExperimentInvalid, match="only a vllm target takes cpus"):
        load_experiment(_write(tmp_path, '{kind: builtin, cpus: "0"}'))
    assert load_experiment(_write(tmp_path, '{kind: vllm, cpus: "0"}')).target.cpus == "0"
    assert load_experiment(_write(tmp_path, "{kind: vllm}")).target.cpus == "auto"


def _affinity(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine a tree to one of them")
def test_the_guard_places_every_process_the_server_forks(tmp_path: Path) -> None:
    """What vLLM's EngineCore and worker inherit: the affinity is set before the server exists,
    so a process it forks later (the helper here) is confined too, and the runner is not."""
    one = min(os.sched_getaffinity(0))
    tree = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "time.sleep(300)")
    guard = subprocess.Popen([sys.executable, "-m", "chaos.host.procguard", "--parent", str(os.getpid()),
                              "--grace", "1", "--cpus", str(one), "--", sys.executable, "-c", tree],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert guard.stdout is not None
        server = int(guard.stdout.readline())
        deadline = time.monotonic() + 10
        while len(group_members(guard.pid)) < 3:  # guard, server, the server's helper
            assert time.monotonic() < deadline, group_members(guard.pid)
            time.sleep(0.05)
        members = [p for p in group_members(guard.pid) if p != guard.pid]
        assert server in members and len(members) == 2
        assert all(_affinity(p) == {one} for p in members), {p: _affinity(p) for p in members}
        assert len(_affinity(os.getpid())) >= 2  # the runner keeps its own
    finally:
        guard.terminate()
        guard.wait(10)
