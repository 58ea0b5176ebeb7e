"""The load process never re-runs the caller's ``__main__`` (issue 41, point 7).

``load.process: own`` (the default) starts the load in a process of its own. Under multiprocessing's
spawn that child re-imported the caller's main module: a script calling the API without an
``if __name__ == "__main__":`` guard ran its body a second time there (and the run failed with
"load workers did not start"), ``python -`` failed on ``<stdin>``, and a module run with ``-m`` was
re-imported by name. Each case runs a guard-less body that appends a line to a file, starts the load
process the way a run does (``make_load`` with ``process: own``), drives a short load against a mock
server and closes it: it exits 0, made records, and its body ran once. (The notebook case, a
``__main__`` with neither ``__file__`` nor a spec, passed under spawn too: it guards the new way.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_BODY = '''\
import asyncio
import os
import time

from chaos.load.driver import make_load
from chaos.load.mock import ThreadedMockServer
from chaos.load.workers import WorkerPool
from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings
from chaos.model.context import ClientPolicy

with open(os.environ["MARK_FILE"], "a", encoding="utf-8") as mark:
    mark.write("body ran\\n")


async def drive(url):
    records = []
    spec = LoadSettings(concurrency=2, max_tokens=(4, 4), request_timeout=10.0, process="own",
                        prompts=PromptSettings(min_chars=16, max_chars=64))
    pool = make_load(spec, LoadTarget(url, "m", 4), policy=ClientPolicy(), sink=records.append)
    assert isinstance(pool, WorkerPool)
    try:
        await pool.ready(10.0)
        await pool.run(time.monotonic_ns() + 300_000_000)
        await pool.drain(5.0)
    finally:
        await pool.aclose()
    return records


with ThreadedMockServer(tick_s=0.005) as server:
    made = asyncio.run(drive(server.base_url))
assert made, "no records"
print("records", len(made))
'''

# As IPython/Jupyter run a cell: the code executes in a fresh module installed as __main__, one
# without __file__ (and without a spec).
_NOTEBOOK = '''\
import sys, types
cell = types.ModuleType("__main__")
sys.modules["__main__"] = cell
exec(compile(sys.stdin.read(), "<cell>", "exec"), cell.__dict__)
'''


def _command(way: str, script: Path) -> tuple[list[str], str | None]:
    if way == "script":
        return [sys.executable, str(script)], None
    if way == "stdin":
        return [sys.executable, "-"], _BODY
    if way == "module":
        return [sys.executable, "-m", script.stem], None
    return [sys.executable, "-c", _NOTEBOOK], _BODY


@pytest.mark.timeout(40)
@pytest.mark.parametrize("way", ["script", "stdin", "module", "notebook"])
def test_a_guardless_caller_runs_once_and_its_load_process_starts(way: str, tmp_path: Path) -> None:
    script = tmp_path / "guardless.py"
    script.write_text(_BODY, encoding="utf-8")
    mark = tmp_path / "mark.txt"
    argv, stdin = _command(way, script)
    done = subprocess.run(argv, input=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "MARK_FILE": str(mark)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "records" in done.stdout
    assert mark.read_text(encoding="utf-8").splitlines() == ["body ran"]


def test_a_worker_that_cannot_start_is_a_setup_failure_and_leaves_none_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second of two workers fails to start: a ``SetupFailed`` naming why, the first one stopped."""
    from chaos.load import workers as workers_module
    from chaos.load.workload import LoadSettings, LoadTarget
    from chaos.model.context import ClientPolicy
    from chaos.model.errors import SetupFailed

    started: list[subprocess.Popen[bytes]] = []
    real = workers_module._start_process

    def second_fails(inbox_fd: int, outbox_fd: int) -> subprocess.Popen[bytes]:
        if started:
            raise SetupFailed("cannot start the load process: no such interpreter")
        started.append(real(inbox_fd, outbox_fd))
        return started[0]

    monkeypatch.setattr(workers_module, "_start_process", second_fails)
    with pytest.raises(SetupFailed, match="no such interpreter"):
        workers_module.WorkerPool(LoadSettings(concurrency=2, workers=2), LoadTarget("http://127.0.0.1:9/", "m", 4),
                                  policy=ClientPolicy(), sink=lambda record: None)
    assert len(started) == 1 and started[0].poll() is not None
