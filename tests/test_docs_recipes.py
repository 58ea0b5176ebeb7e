"""The contributor recipes in docs/dev/ are true: each page's worked example, extracted from the page
as written, registers and works against the real API. The fault recipe's module parses from the
page's experiment through the real loader, rejects the page's bad values with the messages the page
quotes, freezes and resumes a real child process and rolls a freeze back; the panel recipe's module
draws its section into a real report page from a synthetic run. A renamed base class, decorator or
loader function fails here until the page follows."""

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
from collections.abc import Callable, Iterator
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
    from chaos.output.reports.page import PANELS
    from faults.base import REGISTRY

    before_faults, before_panels = dict(REGISTRY), dict(PANELS)
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
    from faults.base import REGISTRY

    before_faults, before_panels = set(REGISTRY), set(PANELS)
    with page_modules(tmp_path) as load:
        load("process_pause", blocks("fault.md")[("module", "process_pause")])
        load("outcomes_panel", blocks("report-panel.md")[("module", "outcomes_panel")])
        assert set(REGISTRY) == before_faults | {"process.pause"} and set(PANELS) == before_panels | {"outcomes"}
    assert set(REGISTRY) == before_faults and set(PANELS) == before_panels
    assert "process_pause" not in sys.modules and str(tmp_path) not in sys.path


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
