"""gpu.throttle and gpu.power_cap against the fake NVML (compiled here), and the CPU fallbacks on real processes.

NVML tests load the fake in this process through ``STREAMCHAOS_NVML_LIB`` (the production path) and,
for crash-safety, inject in a child process that is SIGKILLed and roll back from another child.
Helper processes are real ``chaos.gpu.burner`` processes; every test stops what it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "nvml"))
from fakenvml import build_fake_nvml, fake_env, gcc, read_state, reset_pynvml

from chaos.execution.telemetry import GpuTelemetry
from chaos.gpu import burner
from chaos.gpu.nvml import Nvml, nvml_available
from chaos.model.context import RunContext, SafetySpec, TargetInfo
from chaos.model.errors import FaultPermissionDenied, FaultUnsupported
from faults.gpu import GpuPowerCap, GpuThrottle, choose_backend, clock_at_or_below, contention_shape

pytestmark = pytest.mark.timeout(60)


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if gcc() is None:
        pytest.skip("gcc is not installed: the fake libnvidia-ml.so.1 cannot be built")
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def fake(fake_lib: Path, tmp_path: Path) -> Iterator[SimpleNamespace]:
    """The fake NVML with a fresh state file; ``fake.env`` is the environment for child processes."""
    state = tmp_path / "nvml-state"
    reset_pynvml()
    with fake_env(fake_lib, state) as env:
        yield SimpleNamespace(lib=fake_lib, state=state, env=env)
    reset_pynvml()


def gpu_env(tmp_path: Path, allow: bool = True, device: str = "cuda:0", pid: int | None = None) -> RunContext:
    target = TargetInfo(kind="builtin", base_url="http://127.0.0.1:1/v1", pid=pid, device=device)
    return RunContext(seed=1, target=target, run_dir=tmp_path / "run", safety=SafetySpec(allow_gpu_clock_changes=allow))


def throttle(**params: Any) -> GpuThrottle:
    full = {"device": 0, "sm_clock_mhz": None, "fraction_of_max": None, "backend": "auto", "period": 0.1}
    return GpuThrottle.from_params("throttle", full | params)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[bytes]]:
    """A CPU-bound process standing in for a CPU engine."""
    proc = subprocess.Popen([sys.executable, "-c", "import itertools\nfor i in itertools.count(): pass"])
    yield proc
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait(timeout=10)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ---- pure decisions ------------------------------------------------------------------------------


def test_clock_choice_and_contention_shape() -> None:
    assert clock_at_or_below(1000, [1980, 1005, 990, 975]) == 990
    assert clock_at_or_below(990, [1980, 990]) == 990
    assert clock_at_or_below(100, [1980, 990]) == 990  # nothing low enough: the lowest there is
    assert contention_shape(0.5) == (1, 1.0)
    workers, busy = contention_shape(0.75)
    assert workers == 1 and busy == pytest.approx(0.5)
    assert contention_shape(0.25) == (3, 1.0)
    # the model's promise: the engine keeps `fraction` of the unit
    for f in (0.1, 0.3, 0.5, 0.8):
        k, b = contention_shape(f)
        assert 1 - b * k / (1 + k) == pytest.approx(f)


def test_auto_backend_choice_says_why() -> None:
    assert choose_backend("auto", device="cuda:0", nvml_ok=True, allowed=True, target_pid=1)[0] == "nvml"
    backend, why = choose_backend("auto", device="cuda:0", nvml_ok=True, allowed=False, target_pid=1)
    assert backend == "contention" and "allow_gpu_clock_changes" in why
    assert choose_backend("auto", device="cuda:1", nvml_ok=False, allowed=True, target_pid=None)[0] == "contention"
    assert choose_backend("auto", device="cpu", nvml_ok=True, allowed=True, target_pid=42)[0] == "cpu_duty"
    assert choose_backend("auto", device="cpu", nvml_ok=False, allowed=False, target_pid=None)[0] == "contention"
    assert choose_backend("cpu_duty", device="cuda:0", nvml_ok=True, allowed=True, target_pid=1)[0] == "cpu_duty"


def test_load_time_refusal_without_allow_gpu_clock_changes() -> None:
    denied = SimpleNamespace(safety=SimpleNamespace(allow_gpu_clock_changes=False))
    allowed = SimpleNamespace(safety=SimpleNamespace(allow_gpu_clock_changes=True))
    problems = throttle(backend="nvml", fraction_of_max=0.5).problems(denied)
    assert problems and problems[0][0] == "backend" and "safety.allow_gpu_clock_changes" in problems[0][1]
    assert throttle(backend="nvml", fraction_of_max=0.5).problems(allowed) == []
    assert throttle(backend="auto", fraction_of_max=0.5).problems(denied) == []
    assert "safety.allow_gpu_clock_changes" in GpuPowerCap.from_params("cap", {"device": 0, "watts": 300.0}) \
        .problems(denied)[0][1]
    assert throttle(fraction_of_max=0.01).problems(allowed)[0][0] == "fraction_of_max"


# ---- the nvml backend on the fake ----------------------------------------------------------------


async def test_nvml_lock_reads_back_and_revert_resets(fake: SimpleNamespace, tmp_path: Path) -> None:
    env = gpu_env(tmp_path)
    fault = throttle(fraction_of_max=0.5, backend="nvml")
    fault = fault.activate(env)
    undo = fault.plan()
    assert undo["backend"] == "nvml" and undo["uuid"].startswith("GPU-") and undo["nvml_lib"] == str(fake.lib)
    assert fault.outlives_runner
    evidence = await fault.inject()
    # 50% of 1980 MHz = 990, a supported step: locked min = max = 990, read back under "load"
    assert evidence["locked_mhz"] == 990 and evidence["readback_sm_clock_mhz"] == 990
    assert evidence["lock_in_force"] and evidence["clock_event_reasons"] & 0x2
    assert read_state(fake.state)["dev0.locked_min"] == 990
    reverted = await fault.revert()
    assert reverted["reset"] and reverted["sm_clock_mhz"] == 1980
    assert read_state(fake.state)["dev0.locked_max"] == 0
    assert (await fault.revert())["skipped"]  # idempotent


async def test_nvml_picks_the_nearest_supported_clock_below(fake: SimpleNamespace, tmp_path: Path) -> None:
    env = gpu_env(tmp_path)
    fault = throttle(sm_clock_mhz=1000, backend="auto")
    fault = fault.activate(env)
    fault.plan()
    evidence = await fault.inject()
    try:
        assert evidence["backend"] == "nvml" and "NVML present" in evidence["why"]
        assert evidence["target_mhz"] == 1000 and evidence["locked_mhz"] == 990
    finally:
        await fault.revert()


def test_nvml_refuses_without_allow_gpu_clock_changes(fake: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(FaultPermissionDenied, match="safety.allow_gpu_clock_changes"):
        throttle(fraction_of_max=0.5, backend="nvml").activate(gpu_env(tmp_path, allow=False))
    with pytest.raises(FaultPermissionDenied, match="safety.allow_gpu_clock_changes"):
        GpuPowerCap.from_params("cap", {"device": 0, "watts": 300.0}).activate(gpu_env(tmp_path, allow=False))
    # auto without the permission never touches clocks: it falls back to contention on the GPU
    fault = throttle(fraction_of_max=0.5)
    fault = fault.activate(gpu_env(tmp_path, allow=False))
    assert fault.backend == "contention"
    assert read_state(fake.state) == {}


async def test_nvml_permission_denied_names_the_alternatives(fake: SimpleNamespace, tmp_path: Path) -> None:
    os.environ["FAKE_NVML_DENY"] = "1"
    env = gpu_env(tmp_path)
    fault = throttle(fraction_of_max=0.5, backend="nvml")
    fault = fault.activate(env)  # reading is allowed; the lock is what needs root
    fault.plan()
    with pytest.raises(FaultPermissionDenied, match="contention or cpu_duty") as info:
        await fault.inject()
    assert "no permission" in str(info.value)
    assert (await fault.revert())["skipped"]


def test_nvml_unsupported_on_pre_volta(fake: SimpleNamespace, tmp_path: Path) -> None:
    os.environ["FAKE_NVML_ARCH"] = "4"  # Pascal
    with pytest.raises(FaultUnsupported, match="older than Volta.*contention or cpu_duty"):
        throttle(fraction_of_max=0.5, backend="nvml").activate(gpu_env(tmp_path))
    # and the library's own NOT_SUPPORTED is translated too
    with Nvml() as nv, pytest.raises(FaultUnsupported, match="Volta"):
        nv.lock_sm_clocks(0, 990, 990)


def test_no_nvml_library_is_unsupported(tmp_path: Path) -> None:
    with pytest.raises(FaultUnsupported, match="no NVML library.*contention or cpu_duty"):
        Nvml(str(tmp_path / "missing" / "libnvidia-ml.so.1")).init()


async def test_power_cap_range_set_readback_restore(fake: SimpleNamespace, tmp_path: Path) -> None:
    env = gpu_env(tmp_path)
    with pytest.raises(FaultUnsupported, match="200-700 W"):
        GpuPowerCap.from_params("cap", {"device": 0, "watts": 150.0}).activate(env)
    cap = GpuPowerCap.from_params("cap", {"device": 0, "watts": 300.0})
    cap = cap.activate(env)
    undo = cap.plan()
    assert undo["previous_watts"] == 700.0
    evidence = await cap.inject()
    assert evidence["limit_watts"] == 300.0 and evidence["clock_event_reasons"] & 0x4  # SW power cap
    assert read_state(fake.state)["dev0.power_limit_mw"] == 300_000
    assert (await cap.revert())["limit_watts"] == 700.0
    assert read_state(fake.state)["dev0.power_limit_mw"] == 700_000
    # the library itself rejects an out-of-range limit (INVALID_ARGUMENT → FaultError)
    with Nvml() as nv, pytest.raises(Exception, match="rejected"):
        nv.set_power_limit_watts(0, 900.0)


def test_telemetry_samples(fake: SimpleNamespace) -> None:
    os.environ["FAKE_NVML_DEVICES"] = "2"
    assert nvml_available()
    with GpuTelemetry(devices=[1]) as one:
        only = {s.name: s.value for s in one.sample()}
    assert only["gpu_memory_used_bytes"] == 1 << 30 and only["gpu_sm_clock_mhz"] == 1980
    with Nvml() as nv:
        nv.lock_sm_clocks(1, 990, 990)
    with GpuTelemetry() as telemetry:
        assert telemetry.available()
        samples = telemetry.sample()
    by = {(s.name, s.labels["gpu"]): s.value for s in samples}
    assert set(by) == {(n, g) for n in GpuTelemetry.SERIES for g in ("0", "1")}
    assert by[("gpu_sm_clock_mhz", "0")] == 1980 and by[("gpu_sm_clock_mhz", "1")] == 990
    assert by[("gpu_clock_event_reasons", "1")] == 2 and by[("gpu_power_watts", "0")] == 450.0


INJECT_NVML = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from chaos.model.context import RunContext, SafetySpec, TargetInfo
    from faults.gpu import GpuThrottle

    fault = GpuThrottle.from_params("throttle", {"device": 0, "sm_clock_mhz": None, "fraction_of_max": 0.5,
                                                 "backend": "nvml", "period": 0.1})
    env = RunContext(seed=1, target=TargetInfo(kind="builtin", base_url="http://x/v1", device="cuda:0"),
                     run_dir=Path(sys.argv[1]), safety=SafetySpec(allow_gpu_clock_changes=True))
    fault = fault.activate(env)
    undo = fault.plan()
    evidence = asyncio.run(fault.inject())
    print(json.dumps(undo | evidence.pop("undo", {})), flush=True)
    time.sleep(60)
    """
)

ROLLBACK = ("import json, sys; from faults.base import REGISTRY; import faults; "
            "print(json.dumps(REGISTRY[sys.argv[1]].rollback(json.loads(sys.argv[2]))))")


def test_rollback_from_another_process_after_sigkill_resets_clocks(fake: SimpleNamespace, tmp_path: Path) -> None:
    injector = subprocess.Popen([sys.executable, "-c", INJECT_NVML, str(tmp_path)], stdout=subprocess.PIPE,
                                env=child_env(**fake.env))
    try:
        assert injector.stdout is not None
        undo = json.loads(injector.stdout.readline())
    finally:
        injector.kill()
        injector.wait(timeout=10)
    assert injector.returncode == -signal.SIGKILL
    assert read_state(fake.state)["dev0.locked_max"] == 990  # the killed run left the GPU locked
    # The rollback process is configured like the run (STREAMCHAOS_NVML_LIB): it never loads a library
    # because the plan record names it (tests/test_rollback_trust.py shows that).
    env = child_env(**fake.env)
    resets = []
    for _ in range(2):  # idempotent: the second finds the clock no longer at our lock and leaves it alone
        out = subprocess.run([sys.executable, "-c", ROLLBACK, "gpu.throttle", json.dumps(undo)], env=env,
                             capture_output=True, text=True, timeout=30, check=True)
        result = json.loads(out.stdout)
        assert result["sm_clock_mhz"] == 1980
        resets.append(result["reset"])
    assert resets == [True, False]
    state = read_state(fake.state)
    assert state["dev0.locked_max"] == 0 and state["dev0.reset_calls"] == 1


# ---- contention on CPU -----------------------------------------------------------------------


async def test_cpu_contention_helpers_live_while_injected_and_go_on_revert(tmp_path: Path,
                                                                           busy_child: subprocess.Popen[bytes]) -> None:
    env = gpu_env(tmp_path, allow=False, device="cpu", pid=busy_child.pid)
    fault = throttle(fraction_of_max=0.9, backend="contention")
    fault = fault.activate(env)
    undo = fault.plan()
    evidence = await fault.inject()
    try:
        helpers = evidence["undo"]["helpers"]
        cpus = sorted(os.sched_getaffinity(busy_child.pid))
        assert evidence["cpus"] == cpus and evidence["workers"] == len(cpus) == len(helpers)
        assert burner.find_burners(undo["tag"]) == sorted(h["pid"] for h in helpers)
        assert not fault.outlives_runner
    finally:
        result = await fault.revert()
    assert sorted(result["stopped"]) == sorted(h["pid"] for h in helpers) and result["stuck"] == []
    assert burner.find_burners(undo["tag"]) == []
    assert all(burner.proc_state(h["pid"]) is None for h in helpers)  # reaped, not zombies


INJECT_CONTENTION = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from chaos.model.context import RunContext, TargetInfo
    from faults.gpu import GpuThrottle

    fault = GpuThrottle.from_params("throttle", {"device": 0, "sm_clock_mhz": None, "fraction_of_max": 0.9,
                                                 "backend": "contention", "period": 0.1})
    env = RunContext(seed=1, target=TargetInfo(kind="builtin", base_url="http://x/v1", device="cpu"),
                     run_dir=Path(sys.argv[1]))
    fault = fault.activate(env)

    async def main():
        undo = fault.plan()
        evidence = await fault.inject()
        print(json.dumps(undo | evidence.pop("undo", {})), flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def start_contention_injector(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    injector = subprocess.Popen([sys.executable, "-c", INJECT_CONTENTION, str(tmp_path)], stdout=subprocess.PIPE,
                                env=child_env())
    assert injector.stdout is not None
    line = injector.stdout.readline()
    if not line:
        injector.kill()
        injector.wait()
        raise AssertionError("the injector died before injecting")
    return injector, json.loads(line)


def test_contention_helpers_die_with_a_sigkilled_injector_and_rollback_is_clean(tmp_path: Path) -> None:
    injector, undo = start_contention_injector(tmp_path)
    pids = [h["pid"] for h in undo["helpers"]]
    try:
        assert burner.find_burners(undo["tag"]) == sorted(pids)
    finally:
        injector.kill()
        injector.wait(timeout=10)
    # PR_SET_PDEATHSIG: the helpers end with their parent, without anyone's help
    wait_for(lambda: burner.find_burners(undo["tag"]) == [], 10, "burners to die with their parent")
    out = subprocess.run([sys.executable, "-c", ROLLBACK, "gpu.throttle", json.dumps(undo)], env=child_env(),
                         capture_output=True, text=True, timeout=30, check=True)
    result = json.loads(out.stdout)
    assert result["stuck"] == [] and sorted(result["already_gone"]) == sorted(pids)


def test_rollback_stops_live_helpers_but_never_a_recycled_pid(tmp_path: Path) -> None:
    injector, undo = start_contention_injector(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # A watchdog's view: the runner is alive but its lease expired. One recorded pid now
        # belongs to an unrelated process (pid reuse): it must be left alone.
        record = dict(undo, helpers=undo["helpers"] + [{"pid": stranger.pid,
                                                        "starttime": burner.start_time(stranger.pid)}])
        out = subprocess.run([sys.executable, "-c", ROLLBACK, "gpu.throttle", json.dumps(record)], env=child_env(),
                             capture_output=True, text=True, timeout=30, check=True)
        result = json.loads(out.stdout)
        assert sorted(result["stopped"]) == sorted(h["pid"] for h in undo["helpers"])
        assert result["already_gone"] == [stranger.pid]
        assert stranger.poll() is None
        assert burner.find_burners(undo["tag"]) == []
    finally:
        stranger.kill()
        stranger.wait(timeout=10)
        injector.kill()
        injector.wait(timeout=10)


def test_a_helper_started_as_faults_burner_before_the_move_is_still_recognised(tmp_path: Path) -> None:
    """A journal written before the helpers moved to chaos/gpu/ names helpers whose command line is
    ``faults/burner.py``: rollback still finds them. The tag still decides: another script with the
    tag, or the old script with another tag, is no helper."""
    tag = burner.new_tag()
    scripts = [tmp_path / "faults" / "burner.py", tmp_path / "faults" / "other.py"]
    scripts[0].parent.mkdir()
    for script in scripts:
        script.write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    procs = [subprocess.Popen([sys.executable, str(s), "cpu", "--tag", tag]) for s in scripts]
    try:
        wait_for(lambda: burner.find_burners(tag) == [procs[0].pid], 10, "the old-path helper to be recognised")
        assert not burner.is_burner(procs[0].pid, burner.new_tag())
        assert not burner.is_burner(procs[1].pid, tag)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


# ---- cpu_duty against a real CPU-bound process ----------------------------------------------------


async def test_cpu_duty_slows_the_target_and_revert_leaves_it_running(tmp_path: Path,
                                                                      busy_child: subprocess.Popen[bytes]) -> None:
    env = gpu_env(tmp_path, allow=False, device="cpu", pid=busy_child.pid)
    fault = throttle(fraction_of_max=0.3)  # auto on a CPU engine with a pid → cpu_duty
    fault = fault.activate(env)
    undo = fault.plan()
    assert undo["backend"] == "cpu_duty" and fault.outlives_runner
    await asyncio.sleep(0.2)  # let the child get going
    t0 = cpu_ticks(busy_child.pid)
    await asyncio.sleep(1.0)
    free = cpu_ticks(busy_child.pid) - t0
    evidence = await fault.inject()
    try:
        assert evidence["backend"] == "cpu_duty" and "SIGSTOP" in evidence["why"]
        assert evidence["observed_stopped_share"] > 0.3
        t0 = cpu_ticks(busy_child.pid)
        await asyncio.sleep(1.0)
        throttled = cpu_ticks(busy_child.pid) - t0
    finally:
        result = await fault.revert()
    # ~30% of the CPU time it had; a generous bound for a busy CI box
    assert throttled < 0.65 * free, (throttled, free)
    assert result["target_resumed"] and result["target_state"] in ("R", "S")
    await asyncio.sleep(0.3)
    assert burner.proc_state(busy_child.pid) in ("R", "S")
    assert burner.find_burners(undo["tag"]) == []


async def test_cpu_duty_rollback_after_the_cycler_is_sigkilled(tmp_path: Path,
                                                               busy_child: subprocess.Popen[bytes]) -> None:
    env = gpu_env(tmp_path, allow=False, device="cpu", pid=busy_child.pid)
    fault = throttle(fraction_of_max=0.1, backend="cpu_duty", period=1.0)  # stopped 0.9 s of every second
    fault = fault.activate(env)
    undo = fault.plan()
    evidence = await fault.inject()
    try:
        cycler = evidence["cycler_pid"]
        await asyncio.to_thread(wait_for, lambda: burner.proc_state(busy_child.pid) == "T", 5,
                                "the target to be stopped")
        os.kill(cycler, signal.SIGKILL)  # no chance to SIGCONT: the target stays stopped
        await asyncio.sleep(0.3)
        assert burner.proc_state(busy_child.pid) == "T"
        record = undo | evidence["undo"]
        out = await asyncio.to_thread(subprocess.run,
                                      [sys.executable, "-c", ROLLBACK, "gpu.throttle", json.dumps(record)],
                                      env=child_env(), capture_output=True, text=True, timeout=30, check=True)
        result = json.loads(out.stdout)
        assert result["target_resumed"] and result["target_state"] in ("R", "S")
        await asyncio.sleep(0.3)
        assert burner.proc_state(busy_child.pid) in ("R", "S")
    finally:
        await fault.revert()  # reaps the killed cycler


def test_cpu_duty_refuses_without_a_pid(tmp_path: Path) -> None:
    with pytest.raises(FaultUnsupported, match="pid"):
        throttle(fraction_of_max=0.5, backend="cpu_duty").activate(gpu_env(tmp_path, allow=False, device="cpu"))
    with pytest.raises(FaultUnsupported, match="fraction_of_max"):
        throttle(sm_clock_mhz=900, backend="contention").activate(gpu_env(tmp_path, allow=False, device="cpu"))
