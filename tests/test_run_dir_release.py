"""A run directory's held descriptor (``chaos.host.runfiles``) is let go when its run has written its
last file, whoever ran it (issue 41, review of point 6).

Only the report writer let go before: a ``Runner`` run without one (a library caller's) and a capacity
search's own directory kept theirs, one more per run, until the 64-entry bound closed the oldest,
a run's still in progress among them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from chaos.capacity.probes import Case
from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.host import runfiles
from chaos.model.capacity import CaseAnswer

pytestmark = pytest.mark.timeout(60)

EXPERIMENT = {
    "name": "release", "target": {"url": "http://127.0.0.1:9"}, "load": {"concurrency": 1, "max_tokens": 4},
    "phases": [{"name": "steady", "duration": "1s"}], "sla": [{"kind": "errors", "budget": "0%"}],
}


def _open_under(root: Path) -> list[str]:
    """What this process holds open in or at ``root`` (a directory or file descriptor)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target == str(root) or target.startswith(f"{root}/"):
                found.append(target)
    return found


def _held_under(root: Path) -> list[str]:
    return [key for key in runfiles._held if key.startswith(str(root))]


def _bare_run(out: Path) -> Any:
    """A whole ``Runner.run`` (journal, experiment copy, verdicts) whose bring-up and phases do nothing,
    no report writer among its listeners."""
    runner = Runner(experiment_from_dict(EXPERIMENT), out_dir=out, handle_signals=False)

    async def bring_up(resources: contextlib.AsyncExitStack) -> Any:
        return None

    async def drive(ctx: Any) -> None:
        return None

    runner._bring_up = bring_up  # type: ignore[method-assign]  # the test stands in for the bring-up
    runner._drive = drive  # type: ignore[method-assign]  # and for the phases
    return asyncio.run(runner.run())


def test_a_run_without_a_report_writer_lets_its_directory_go(tmp_path: Path) -> None:
    for i in range(3):
        result = _bare_run(tmp_path / f"run{i}")
        assert (tmp_path / f"run{i}" / "journal.jsonl").is_file() and result.status == "completed", result.error
    assert _held_under(tmp_path) == []  # before: all three, held for the life of the process
    assert _open_under(tmp_path) == []


def test_a_run_that_fails_to_take_its_directory_lets_go_of_no_other(tmp_path: Path) -> None:
    """A second run pointed at a directory another run of this process holds is refused (not empty)
    and must not release the first one's descriptor."""
    taken = tmp_path / "taken"
    runfiles.prepare_private_dir(taken)
    (taken / "journal.jsonl").write_text("")
    try:
        with pytest.raises(Exception, match="not empty"):
            _bare_run(taken)
        assert _held_under(taken) == [str(taken)]
    finally:
        runfiles.release_dir(taken)


CAPACITY = {**EXPERIMENT, "capacity": {"max": 4}}


def _searched(monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    """Each case of the search answered at once (no probe run), or the search failing."""
    import chaos.capacity.run as capacity_run

    async def case(self: Any, case: Case, start: float | None) -> CaseAnswer:
        if fail:
            raise RuntimeError("a bug in the search")
        return capacity_run.answer(self.spec, case, [], "not searched here")

    monkeypatch.setattr(capacity_run._Search, "case", case)


@pytest.mark.parametrize("fail", [False, True])
def test_a_capacity_search_lets_its_directory_go_after_its_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    from chaos.capacity.report import write_capacity_report
    from chaos.capacity.run import as_dict, search_capacity

    _searched(monkeypatch, fail)
    out = tmp_path / "search"
    exp = experiment_from_dict(CAPACITY)
    if fail:
        with pytest.raises(RuntimeError):
            asyncio.run(search_capacity(exp, out_dir=out, say=lambda line: None, handle_signals=False))
    else:
        found = asyncio.run(search_capacity(exp, out_dir=out, say=lambda line: None, handle_signals=False))
        assert _held_under(out) == [str(out)] and _open_under(out) == [str(out)]  # held for its report
        write_capacity_report(as_dict(found), out)
        assert (out / "capacity.json").is_file()
    assert _held_under(out) == []  # before: held for the life of the process
    assert _open_under(out) == []
