"""The contributor recipes in docs/dev/ are true: each page's worked example, extracted from the page
as written, registers and works against the real API. The fault recipe's module parses from the
page's experiment through the real loader, rejects the page's bad values with the messages the page
quotes, freezes and resumes a real child process and rolls a freeze back; the panel recipe's module
draws its section into a real report page from a synthetic run; the SLA recipe's verifier passes and
fails a synthetic run's observations and is taken by the loader; the target recipe's kind is taken by
the loader, accounted for by the dry run, has its support column, and starts and stops a real local
server. A renamed base class, decorator or loader function fails here until the page follows."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "docs" / "dev"

pytestmark = pytest.mark.timeout(60)

# a marker comment, then the fenced block it names: <!-- recipe: module NAME --> ```python ... ```
_BLOCK = re.compile(r"<!-- recipe: (module|experiment|support) (\w+) -->\n```\w+\n(.*?)```", re.S)
# a marker comment, then a blockquote of one code span: what the loader says for that value
_INVALID = re.compile(r"<!-- recipe: invalid (.+?) -->\n> `(.+?)`\n")


def blocks(page: str) -> dict[tuple[str, str], str]:
    """(what, name) → the fenced block's text, for every marked block on ``docs/dev/<page>``."""
    found = {(what, name): body for what, name, body in _BLOCK.findall((DEV / page).read_text(encoding="utf-8"))}
    assert found, f"docs/dev/{page} has no <!-- recipe: ... --> block"
    return found


LoadModule = Callable[[str, str], ModuleType]


@contextlib.contextmanager
def page_modules(directory: Path) -> Iterator[LoadModule]:
    """Import pages' modules from ``directory`` (so they register); on exit, unregister what they
    registered and forget the modules, leaving the registries as they were."""
    import sla  # noqa: F401  (the shipped verifiers registered first, as a run finds them)
    from chaos.output.reports.page import PANELS
    from chaos.targets.base import TARGET_KINDS
    from chaos.targets.registry import kinds
    from faults.base import REGISTRY
    from sla.base import REGISTRY as VERIFIERS

    kinds()  # the shipped target kinds found first, so restoring keeps them
    before_faults, before_panels = dict(REGISTRY), dict(PANELS)
    before_verifiers, before_targets = dict(VERIFIERS), dict(TARGET_KINDS)
    imported: list[str] = []
    sys.path.insert(0, str(directory))

    def load(name: str, source: str) -> ModuleType:
        (directory / f"{name}.py").write_text(source, encoding="utf-8")
        imported.append(name)
        return importlib.import_module(name)

    try:
        yield load
    finally:
        sys.path.remove(str(directory))
        for name in imported:
            sys.modules.pop(name, None)
        REGISTRY.clear()
        REGISTRY.update(before_faults)
        PANELS.clear()
        PANELS.update(before_panels)
        VERIFIERS.clear()
        VERIFIERS.update(before_verifiers)
        TARGET_KINDS.clear()
        TARGET_KINDS.update(before_targets)


@pytest.fixture
def recipe_module(tmp_path: Path) -> Iterator[LoadModule]:
    with page_modules(tmp_path) as load:
        yield load


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process standing in for the serving process; killed and reaped at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _state(pid: int, stopped: bool, timeout_s: float = 5.0) -> str | None:
    from chaos.host.procs import proc_state

    deadline = time.monotonic() + timeout_s
    while ((state := proc_state(pid)) == "T") != stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


def test_the_fault_recipe_parses_validates_injects_reverts_and_rolls_back(
        recipe_module: LoadModule, sleeper: subprocess.Popen[bytes], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.experiment.loader import parse_experiment
    from chaos.model.context import RunContext, TargetInfo
    from chaos.model.errors import ExperimentInvalid
    from faults.base import REGISTRY, Fault, Injection

    page = blocks("fault.md")
    module = recipe_module("process_pause", page[("module", "process_pause")])
    cls = REGISTRY["process.pause"]
    assert cls.__module__ == module.__name__ and issubclass(cls, Fault)

    text = page[("experiment", "process_pause")]
    experiment = parse_experiment(text, "pause.yaml")
    fault = next(f for phase in experiment.phases for f in phase.faults if f.kind == "process.pause")
    assert isinstance(fault, cls) and fault.params == {"hold": 1.5}  # 1.5s, parsed into seconds

    quoted = _INVALID.findall((DEV / "fault.md").read_text(encoding="utf-8"))
    assert len(quoted) >= 2, "the page quotes what the loader says for a bad value"
    for value, message in quoted:
        key = value.split(":", 1)[0]
        bad = re.sub(rf"^(\s+){key}: .*$", rf"\g<1>{value}", text, count=1, flags=re.M)
        assert bad != text, f"the page's experiment has no {key}: line"
        with pytest.raises(ExperimentInvalid) as caught:
            parse_experiment(bad, "pause.yaml")
        assert message in str(caught.value), f"the page quotes {message!r}; the loader says {caught.value}"

    ctx = RunContext(seed=1, target=TargetInfo(kind="builtin", base_url="http://127.0.0.1:1/v1", pid=sleeper.pid),
                     run_dir=tmp_path)

    async def inject_then_revert() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        injection = fault.activate(ctx)
        assert isinstance(injection, Injection)
        undo = injection.plan()
        assert undo["pid"] == sleeper.pid
        evidence = await injection.inject()
        assert _state(sleeper.pid, stopped=True) == "T", "inject did not stop the process"
        reverted = await injection.revert()
        assert _state(sleeper.pid, stopped=False) not in ("T", None), "revert did not resume the process"
        return undo, evidence, reverted

    undo, evidence, reverted = asyncio.run(inject_then_revert())
    assert evidence["pid"] == sleeper.pid and reverted["resumed"] == sleeper.pid

    # a killed runner: the process stays stopped; rollback resumes it from the plan record alone
    sleeper.send_signal(signal.SIGSTOP)
    assert _state(sleeper.pid, stopped=True) == "T"
    assert cls.rollback(undo) == {"resumed": sleeper.pid}
    assert _state(sleeper.pid, stopped=False) not in ("T", None)
    assert "skipped" in cls.rollback(undo)  # idempotent: a running process is left alone

    # the support matrix's entry the page gives: every target column decided, the pid's columns only
    from chaos.output.support import NEEDS, fault_support, render_markdown

    entry = ast.literal_eval("{" + page[("support", "process_pause")] + "}")
    monkeypatch.setattr("chaos.output.support.NEEDS", {**NEEDS, **entry})
    support = fault_support("process.pause")
    assert "?" not in support.values() and support == fault_support("process.kill"), support
    assert "| `process.pause` |" in render_markdown([*REGISTRY], [])

    # a target the runner did not start has no pid: activation says so
    remote = RunContext(seed=1, target=TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    with pytest.raises(Exception, match="needs the pid of the serving process"):
        fault.activate(remote)


def test_the_recipes_leave_the_registries_as_they_found_them(tmp_path: Path) -> None:
    from chaos.output.reports.page import PANELS
    from chaos.targets.base import TARGET_KINDS
    from chaos.targets.registry import kinds
    from faults.base import REGISTRY
    from sla.base import REGISTRY as VERIFIERS

    registries: tuple[Mapping[str, object], ...] = (REGISTRY, PANELS, VERIFIERS, TARGET_KINDS)
    kinds()
    before = [set(r) for r in registries]
    with page_modules(tmp_path) as load:
        load("process_pause", blocks("fault.md")[("module", "process_pause")])
        load("outcomes_panel", blocks("report-panel.md")[("module", "outcomes_panel")])
        load("e2e", blocks("sla-verifier.md")[("module", "e2e")])
        load("command_target", blocks("target-kind.md")[("module", "command_target")])
        added = [set(r) - b for r, b in zip(registries, before, strict=True)]
        assert added == [{"process.pause"}, {"outcomes"}, {"e2e"}, {"command"}], added
    assert [set(r) for r in registries] == before
    assert "builtin" in kinds() and "ttft" in VERIFIERS  # the shipped ones kept
    assert not {"process_pause", "e2e", "command_target"} & set(sys.modules) and str(tmp_path) not in sys.path


def test_the_panel_recipe_draws_its_section_into_a_real_report_page(
        recipe_module: LoadModule, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "reports"))
    from synthetic import synthetic_run  # tests/reports/synthetic.py

    from chaos.output.reports.page import PANELS, render_html

    module = recipe_module("outcomes_panel", blocks("report-panel.md")[("module", "outcomes_panel")])
    assert PANELS["outcomes"].render is module.render_outcomes

    report, obs = synthetic_run(streams=300, seconds=30)
    page = render_html(report, obs)
    start = page.index('<section id="outcomes"><h2>Outcomes by phase</h2>')
    assert start < page.index('<section id="environment">') and start > page.index('<section id="faults">')
    section = page[start:page.index("</section>", start)]

    columns = re.findall(r"<th>(.*?)</th>", section)
    assert columns[:2] == ["phase", "streams"]
    for phase in ("baseline", "fault", "recovery"):
        streams = obs.population(phase)
        row = re.search(rf'<tr data-phase="{phase}">(.*?)</tr>', section)
        assert row, f"no row for phase {phase}"
        cells = [int(c) for c in re.findall(r'<td class="num">(\d+)</td>', row.group(1))]
        shown = dict(zip(columns[1:], cells, strict=True))
        # counted here independently of the panel
        expected = Counter(
            "hung up by a client fault" if s.hangup else
            "error" if s.error or s.in_band_error or (s.status or 200) >= 400 else
            "complete" if obs.complete(s) else "cut" for s in streams)
        assert shown["streams"] == len(streams)
        assert sum(shown[c] for c in columns[2:]) == len(streams)
        for column in columns[2:]:
            assert shown[column] == expected[column], (phase, column)
    assert sum(1 for s in obs.population("fault") if s.error) > 0, "the synthetic run cuts streams in its fault phase"


def test_a_panel_may_not_take_a_builtin_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "reports"))
    from synthetic import synthetic_run  # tests/reports/synthetic.py

    from chaos.output.reports.page import BUILTIN_SECTIONS, PANELS, panel, render_html

    drawn = re.findall(r'<section id="([^"]+)">', render_html(*synthetic_run(streams=50, seconds=6)))
    assert [d for d in drawn if d not in PANELS] == list(BUILTIN_SECTIONS), "BUILTIN_SECTIONS is not what it draws"

    with pytest.raises(AssertionError, match="registered twice"):
        panel(BUILTIN_SECTIONS[0], "Mine")(lambda report, obs: "")
    assert BUILTIN_SECTIONS[0] not in PANELS


def test_the_sla_recipe_passes_and_fails_on_observations_and_is_accepted_by_the_loader(
        recipe_module: LoadModule, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "reports"))
    import numpy as np
    from synthetic import synthetic_run  # tests/reports/synthetic.py

    import sla
    from chaos.execution.verify import judge_entry
    from chaos.experiment.loader import parse_experiment
    from chaos.output.support import render_markdown
    from sla.base import REGISTRY, missing_facts

    page = blocks("sla-verifier.md")
    module = recipe_module("e2e", page[("module", "e2e")])
    cls = REGISTRY["e2e"]
    assert cls is module.E2e and missing_facts(cls) == []

    _, obs = synthetic_run(streams=300, seconds=30)
    # the median end-to-end time of the baseline, measured here independently of the verifier
    times = [(s.t_content[-1] - s.t_sent) / 1e9 for s in obs.population("baseline") if s.t_content and s.t_sent]
    median = float(np.quantile(times, 0.5))
    assert len(times) > 50 and median > 0

    within = sla.judge(obs, "e2e", {"quantile": "p50", "budget": f"{median * 2000:.0f}ms"}, "baseline")
    over = sla.judge(obs, "e2e", {"quantile": "p50", "budget": f"{median * 500:.0f}ms"}, "baseline")
    assert (within.status, over.status) == ("pass", "fail"), (within, over)
    assert within.samples == over.samples == len(times) and within.unit == "s"
    assert within.figure is not None and abs(within.figure - median) <= 0.1 * median, (within.figure, median)

    experiment = parse_experiment(page[("experiment", "e2e")], "e2e.yaml")
    (entry,) = experiment.sla
    assert isinstance(entry.spec, cls) and entry.params == {"quantile": 0.9, "budget": 4.0, "confidence": 0.95}
    assert judge_entry(entry, obs, "baseline").status in ("pass", "fail", "inconclusive")
    assert "| `e2e` |" in render_markdown([], ["e2e"])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_target_recipe_is_loaded_accounted_for_supported_and_starts_a_real_server(
        recipe_module: LoadModule, tmp_path: Path) -> None:
    import shutil

    import httpx
    import yaml

    from chaos.execution.dryrun import dry_run
    from chaos.experiment.loader import experiment_from_dict, parse_experiment
    from chaos.model.errors import ExperimentInvalid, SetupFailed
    from chaos.output.support import fault_support, render_markdown
    from chaos.targets.registry import kinds, start_target

    page = blocks("target-kind.md")
    module = recipe_module("command_target", page[("module", "command_target")])
    cls = kinds()["command"]
    assert cls is module.CommandTarget

    text = page[("experiment", "command_target")]
    written = parse_experiment(text, "llama.yaml")
    assert written.target.kind == "command" and written.target.option("argv")[0] == "llama-server"
    with pytest.raises(ExperimentInvalid, match=r"only a command target takes 'argv'"):
        experiment_from_dict({"name": "x", "target": {"kind": "builtin", "argv": ["x"]},
                              "phases": [{"name": "p", "duration": "1s"}]})
    if shutil.which("llama-server") is None:  # the page's own command is not here: the dry run says so
        account = asyncio.run(dry_run(written))
        assert account.exit_code == 4 and any("NOT POSSIBLE HERE" in line for line in account.lines)

    # the page's experiment, serving a real local server: Python's http.server answering GET /v1/models
    (tmp_path / "site" / "v1").mkdir(parents=True)
    (tmp_path / "site" / "v1" / "models").write_text('{"data": [{"id": "tiny"}]}', encoding="utf-8")
    port = _free_port()
    data = yaml.safe_load(text)
    data["target"].update(argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                "--directory", str(tmp_path / "site")],
                          url=f"http://127.0.0.1:{port}/v1", startup_timeout="20s")
    experiment = experiment_from_dict(data)

    account = asyncio.run(dry_run(experiment))
    said = "\n".join(account.lines)
    assert f"target: {sys.executable} -m http.server {port}" in said and "start-up allowance 20s" in said, said
    assert account.exit_code == 0 and "contacted: nothing" in said, said

    support = fault_support("process.kill")
    assert support["command"] == "yes" and fault_support("client.disconnect")["command"] == "yes"
    assert fault_support("server.stall")["command"] == "no" and "command (started by the run" in render_markdown([], [])

    # a URL does not stand in for it: target.url is where the server it starts listens
    target = start_target(experiment.target, target_url=experiment.target.url, run_dir=tmp_path, seed=0)
    assert isinstance(target, cls)
    try:
        info = asyncio.run(target.start())
        assert info.pid == target.process.pid and info.base_url == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(info.base_url + "/models", timeout=5, trust_env=False).json()["data"][0]["id"] == "tiny"
        asyncio.run(target.stop())
        assert target.process.poll() is not None, "stop left the server running"
        asyncio.run(target.stop())  # idempotent
    finally:
        if target.process is not None and target.process.poll() is None:
            target.process.kill()
            target.process.wait(timeout=10)

    broken = dict(data, target={**data["target"], "argv": [sys.executable, "-c", "raise SystemExit(3)"]})
    failing = start_target(experiment_from_dict(broken).target, target_url=None, run_dir=tmp_path, seed=0)
    with pytest.raises(SetupFailed, match="it exited 3"):
        asyncio.run(failing.start())
