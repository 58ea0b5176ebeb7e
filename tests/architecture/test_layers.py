"""The layering the design promises: what each room imports, what the package exports, specs vs run state."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import chaos
import faults
from chaos.experiment import experiment_from_dict
from chaos.load.workload import LoadSettings
from faults.base import REGISTRY, Fault

ROOT = Path(__file__).resolve().parents[2]


def _loaded_in_a_fresh_process(code: str) -> list[str]:
    """What ``code`` (which prints a list of module names) reports, run in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    loaded: list[str] = ast.literal_eval(out.stdout.strip())
    return loaded


def test_chaos_exports_exactly_its_front_door() -> None:
    assert sorted(chaos.__all__) == [
        "ChaosError", "Experiment", "ExperimentInvalid", "FaultError", "FaultPermissionDenied", "FaultRevertFailed",
        "FaultUnsupported", "Result", "SetupFailed", "TargetNotAllowed", "TargetUnreachable", "UsageError", "Verdict",
        "VerificationInconclusive",
        "load_experiment", "run", "run_async",
    ]
    for name in chaos.__all__:
        assert getattr(chaos, name) is not None, name


def test_a_load_worker_imports_no_fault_family() -> None:
    """A spawned load worker imports the worker module and unpickles its config (settings + client
    rules); none of that may load a fault family, pynvml, toxiproxy or the engine."""
    experiment = experiment_from_dict({
        "name": "w", "load": {"concurrency": 2},
        "phases": [{"name": "p", "duration": "1s", "faults": [{"kind": "client.disconnect", "after_tokens": [1, 3]},
                                                               {"kind": "client.slow_reader", "read_delay": "5ms"}]}],
    })
    rules = {f.name: f.rule() for _, f in experiment.faults()}  # type: ignore[attr-defined]
    config = pickle.dumps({"spec": LoadSettings.of(experiment.load), "rules": rules})
    code = (
        "import pickle, sys\n"
        "import chaos.load.workers  # the spawned process's target lives here\n"
        f"pickle.loads(bytes.fromhex({config.hex()!r}))\n"
        # the fault families' backends moved out of faults/ (chaos.gpu, chaos.toxiproxy): still none of them
        "heavy = ('faults', 'pynvml', 'toxiproxy', 'chaos.gpu', 'chaos.toxiproxy', 'torch', 'chaos.stack', "
        "'chaos.execution.runner')\n"
        "print(sorted(m for m in sys.modules if m == 'faults' or m.startswith(heavy)))\n"
    )
    assert _loaded_in_a_fresh_process(code) == []


def test_a_load_shard_imports_no_fault_family() -> None:
    """`streamchaos shard` (a pod on another host) parses its command line and loads the shard module:
    none of that may load a fault family, pynvml, toxiproxy, the engine or the runner."""
    code = (
        "import sys\n"
        "from chaos.cli import _parser\n"
        "args = _parser().parse_args(['shard', '--coordinator', '127.0.0.1:1', '--count', '2', '--index', '0'])\n"
        "import chaos.load.shard_process, chaos.load.wire\n"
        "heavy = ('faults', 'pynvml', 'toxiproxy', 'chaos.gpu', 'chaos.toxiproxy', 'torch', 'chaos.stack', "
        "'chaos.execution.runner', "
        "'chaos.experiment')\n"
        "print(sorted(m for m in sys.modules if m == 'faults' or m.startswith(heavy)))\n"
    )
    assert _loaded_in_a_fresh_process(code) == []


def test_what_never_judges_never_imports_scipy_stats_or_matplotlib() -> None:
    """scipy.stats takes 1.1 s of CPU to import and matplotlib about as much: `validate`, `list`, a dry
    run, the runner until it judges, and every process it starts (stack, proxy, watchdog, guard) load
    the fault and SLA catalogues but never judge or draw; the suite starts hundreds of them."""
    code = (
        "import sys\n"
        "import chaos.cli, chaos.execution.runner, chaos.execution.watchdog, chaos.host.procguard\n"
        "import chaos.stack.serve, chaos.toxiproxy.server.server, chaos.load.workers, sla.stats\n"
        "print(sorted(m for m in sys.modules if m.startswith(('scipy.stats', 'matplotlib'))))\n"
    )
    assert _loaded_in_a_fresh_process(code) == []


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_fault_kind_is_a_frozen_spec_whose_fields_are_its_parameters(kind: str) -> None:
    cls = REGISTRY[kind]
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
    assert fields == set(cls.schema.names()), f"{kind}: fields {sorted(fields)} vs schema {cls.schema.names()}"
    assert faults.REGISTRY is REGISTRY and issubclass(cls, Fault)


def test_an_experiment_holds_no_run_state() -> None:
    experiment = experiment_from_dict({
        "name": "frozen", "target": {"kind": "builtin"},
        "phases": [{"name": "p", "duration": "1s", "faults": [{"kind": "kv.pressure", "fraction": 0.5},
                                                               {"kind": "gpu.throttle", "fraction_of_max": 0.5}]}],
    })
    kv = experiment.phases[0].faults[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kv.fraction = 0.9  # type: ignore[misc]
    assert hash(experiment) == hash(experiment_from_dict({
        "name": "frozen", "target": {"kind": "builtin"},
        "phases": [{"name": "p", "duration": "1s", "faults": [{"kind": "kv.pressure", "fraction": 0.5},
                                                               {"kind": "gpu.throttle", "fraction_of_max": 0.5}]}],
    }))
    # nothing but parameters: no attribute a run could fill in
    for _, fault in experiment.faults():
        assert set(vars(fault)) == {f.name for f in dataclasses.fields(fault)}
