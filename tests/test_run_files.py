"""Run directories are the runner's own (0700) and run files are created 0600, never through a link.

Issue 23 point 1: another local user who pre-creates ``--out`` (or can write to it) must not make a
root runner overwrite a file of their choosing with report content.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.cli import main
from chaos.execution.result import Result
from chaos.experiment import experiment_from_dict
from chaos.host.runfiles import (
    make_private_dir,
    open_append,
    prepare_private_dir,
    release_dir,
    replace_file,
    touch,
    unsafe_parent,
    write_new,
)
from chaos.model.errors import ReportWriteFailed, UsageError
from chaos.model.observations import Observations

SHORT = {
    "name": "run-files",
    "target": {"kind": "builtin", "model": "tiny"},
    "load": {"concurrency": 1, "max_tokens": 4},
    "phases": [{"name": "steady", "duration": "500ms"}],
    "sla": [{"kind": "errors", "budget": "0%"}],
    "safety": {"cleanup_window": "100ms"},
}


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on: the run fails fast (exit 4) but writes its files
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def _experiment(tmp_path: Path) -> Path:
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(SHORT), encoding="utf-8")
    return exp


def finished_result(out: Path) -> Result:
    """A finished run with no streams, as the report writer gets it."""
    out.mkdir(mode=0o700)
    return Result(experiment=experiment_from_dict(SHORT), verdicts=[],
                  observations=Observations(experiment="run-files"),
                  out_dir=out, status="completed", exit_code=0, started=0.0, ended=1.0)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o1777])
def test_an_out_dir_writable_by_group_or_others_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           mode: int) -> None:
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(mode)
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by group or others" in err and str(out) in err and "Traceback" not in err
    assert list(out.iterdir()) == [] and _mode(out) == mode  # nothing written, nothing changed


def test_an_out_dir_another_user_owns_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    out = tmp_path / "theirs"
    out.mkdir(mode=0o700)
    os.chown(out, 65534, 65534)  # nobody
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "owned by uid 65534" in err and "Traceback" not in err
    assert list(out.iterdir()) == []


def test_an_out_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UsageError, match="symbolic link"):
        prepare_private_dir(tmp_path / "link")


@pytest.mark.timeout(120)
def test_run_files_are_0600_and_the_run_dir_0700(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir(mode=0o755)  # ours, not writable by others: taken, and tightened
    os.chmod(out, 0o755)
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(out), "--quiet"]) == 4
    assert _mode(out) == 0o700
    names = {p.name for p in out.iterdir()}
    assert {"journal.jsonl", "experiment.yaml", "report.json", "report.html", "junit.xml"} <= names
    assert {p.name: oct(_mode(p)) for p in out.iterdir()} == {name: oct(0o600) for name in names}
    fresh = tmp_path / "new" / "run"  # created, parents too
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(fresh), "--quiet"]) == 4
    assert _mode(fresh) == 0o700 and all(_mode(p) == 0o600 for p in fresh.iterdir())


def test_a_symlink_planted_in_a_run_dir_is_not_followed(tmp_path: Path) -> None:
    """Every way a run file is written: new (reports, journal, experiment copy), appended (logs),
    replaced (verify, pages)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    for name in ("report.html", "watchdog.log", "verify.json"):
        (run_dir / name).symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_new(run_dir / "report.html", "<html>")
    with pytest.raises(OSError):
        open_append(run_dir / "watchdog.log")
    replace_file(run_dir / "verify.json", "{}")
    assert victim.read_text(encoding="utf-8") == "precious\n"
    assert not (run_dir / "verify.json").is_symlink() and (run_dir / "verify.json").read_text() == "{}"
    assert _mode(run_dir / "verify.json") == 0o600
    os.link(victim, run_dir / "hard.log")  # a second name for someone's file: not appended to either
    with pytest.raises(PermissionError):
        open_append(run_dir / "hard.log")
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_the_report_writer_does_not_write_through_a_planted_link(tmp_path: Path) -> None:
    """A run's report files go through the helper: a link where report.json goes leaves its target untouched."""
    from chaos.output.report import write_reports

    victim = tmp_path / "victim"
    victim.write_text("precious\n", encoding="utf-8")
    result = finished_result(tmp_path / "run")
    (tmp_path / "run" / "report.json").symlink_to(victim)
    with pytest.raises(ReportWriteFailed, match=r"run/report\.json: something is already there"):  # issue 41.6
        write_reports(result)
    assert victim.read_text(encoding="utf-8") == "precious\n"
    # the other files were still written, each 0600
    assert _mode(tmp_path / "run" / "report.html") == 0o600 and _mode(tmp_path / "run" / "junit.xml") == 0o600


@pytest.mark.parametrize("credential", [{"api_key_env": "RUN_FILES_KEY"}, {"api_key": "sk-literal-0123456789abcdef"}])
def test_a_dict_built_experiment_is_kept_as_its_file_would_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credential: dict[str, str]) -> None:
    """experiment.yaml of a dict-built experiment is the dict as given, as a file's is the file as written
    (0600): a key named by its variable stays a name, a literal key is kept exactly where the file copy
    keeps it, and the copy loads back to the same experiment."""
    from chaos.execution.runner import save_experiment
    from chaos.experiment import load_experiment

    monkeypatch.setenv("RUN_FILES_KEY", "sk-from-env-" + "7" * 16)
    data = dict(SHORT, target={**SHORT["target"], **credential})
    from_file, from_dict = tmp_path / "file", tmp_path / "dict"
    for out in (from_file, from_dict):
        out.mkdir(mode=0o700)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    save_experiment(load_experiment(tmp_path / "exp.yaml"), from_file)
    exp = experiment_from_dict(data)
    save_experiment(exp, from_dict)
    copy = from_dict / "experiment.yaml"
    assert _mode(copy) == 0o600
    text, file_text = copy.read_text(encoding="utf-8"), (from_file / "experiment.yaml").read_text(encoding="utf-8")
    assert "sk-from-env-" not in text + file_text  # a resolved key is never written
    assert ("sk-literal-" in text) == ("sk-literal-" in file_text) and "sk-literal-" not in repr(exp)
    assert replace(load_experiment(copy), source=None) == exp  # the same experiment, from wherever it is read


def test_a_prompt_file_named_relative_to_the_experiment_is_found_from_the_kept_copy(tmp_path: Path) -> None:
    """`verify` reads experiment.yaml from the run directory: a prompt file named relative to the
    experiment's own file must still be the same file from there."""
    from chaos.execution.runner import save_experiment
    from chaos.experiment import load_experiment

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "prompts.jsonl").write_text('{"prompt": "hello"}\n', encoding="utf-8")
    data = dict(SHORT, load={**SHORT.get("load", {}), "prompts": {"source": "prompts.jsonl"}})
    (tmp_path / "src" / "exp.yaml").write_text("# kept as written\n" + yaml.safe_dump(data), encoding="utf-8")
    exp = load_experiment(tmp_path / "src" / "exp.yaml")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    save_experiment(exp, run_dir)
    kept = load_experiment(run_dir / "experiment.yaml")  # raised "prompt file 'prompts.jsonl' not found" before
    assert kept.load.prompts.source == exp.load.prompts.source == str((tmp_path / "src" / "prompts.jsonl").resolve())
    assert (run_dir / "experiment.yaml").read_text(encoding="utf-8").startswith("# kept as written\n")


def test_the_embedded_toxiproxy_log_is_0600_and_never_written_through_a_link(tmp_path: Path) -> None:
    """The embedded Toxiproxy's stderr goes to the run directory's toxiproxy.log like every other
    run file: created 0600, and a link planted where it goes is refused, its target untouched."""
    from chaos.execution.proxy import resolve_server

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    server = resolve_server("embedded", None, 1, run_dir / "toxiproxy.log")
    try:
        assert server.kind == "embedded"
    finally:
        server.stop()
    assert _mode(run_dir / "toxiproxy.log") == 0o600
    victim = tmp_path / "victim"
    victim.write_text("precious\n", encoding="utf-8")
    (run_dir / "linked.log").symlink_to(victim)
    with pytest.raises(OSError):
        resolve_server("embedded", None, 1, run_dir / "linked.log")
    assert victim.read_text(encoding="utf-8") == "precious\n"


# ---- issue 41.6: the run directory held by a descriptor; parents another user could swap refused ---------------


def _swap_for_link(run_dir: Path, elsewhere: Path) -> Path:
    """What a user who can write ``run_dir``'s parent can do mid-run: rename the run directory away and
    put a link to a directory of hers in its place. Returns where the real directory went."""
    moved = run_dir.with_name(run_dir.name + ".moved")
    os.rename(run_dir, moved)
    run_dir.symlink_to(elsewhere, target_is_directory=True)
    return moved


def test_every_kind_of_run_file_goes_into_the_directory_taken_not_through_a_swapped_name(tmp_path: Path) -> None:
    from chaos.execution.journal import Journal
    from chaos.output.report import write_reports

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    run_dir = tmp_path / "run"
    prepare_private_dir(run_dir)
    moved = _swap_for_link(run_dir, theirs)
    try:
        journal = Journal(run_dir / "journal.jsonl", "x", 0, 0.0)
        journal.close("completed")
        write_reports(finished_result_in(run_dir))
        with open_append(run_dir / "watchdog.log") as log:
            log.write(b"line\n")
        touch(run_dir / "watchdog.log")
        replace_file(run_dir / "verify.json", "{}")
        make_private_dir(run_dir / "hops")
        write_new(run_dir / "hops" / "a.log", "hop")
        prepare_private_dir(run_dir / "probe-1")  # a capacity probe's run inside the search's directory
        write_new(run_dir / "probe-1" / "report.json", "{}")
    finally:
        release_dir(run_dir / "probe-1")
        release_dir(run_dir)
    assert list(theirs.iterdir()) == []  # before: all of them, created by the runner in her directory
    assert {p.name for p in moved.iterdir()} == {"journal.jsonl", "report.json", "report.html", "junit.xml",
                                                 "watchdog.log", "verify.json", "hops", "probe-1"}
    assert (moved / "hops" / "a.log").read_text() == "hop" and _mode(moved / "probe-1") == 0o700


def finished_result_in(out: Path) -> Result:
    """``finished_result`` for a directory already taken."""
    return Result(experiment=experiment_from_dict(SHORT), verdicts=[],
                  observations=Observations(experiment="run-files"),
                  out_dir=out, status="completed", exit_code=0, started=0.0, ended=1.0)


@pytest.mark.timeout(120)
def test_a_run_whose_directory_is_swapped_mid_run_writes_nothing_where_the_link_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole run: the swap right after the experiment copy is written, before the journal and the reports."""
    import chaos.execution.runner as runner

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    out = tmp_path / "run"
    keep = runner.save_experiment
    moved: list[Path] = []

    def save_then_swap(exp: Any, out_dir: Path) -> None:
        keep(exp, out_dir)
        moved.append(_swap_for_link(out_dir, theirs))

    monkeypatch.setattr(runner, "save_experiment", save_then_swap)
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(out), "--quiet"]) == 4
    assert list(theirs.iterdir()) == []
    assert {"journal.jsonl", "experiment.yaml", "report.json", "report.html", "junit.xml"} <= {
        p.name for p in moved[0].iterdir()}


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_an_out_under_a_directory_others_may_write_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if mode == 0o775:  # a group that is not this user's alone
        if os.geteuid() != 0:
            pytest.skip("chgrp to another group needs root")
        os.chown(shared, -1, 65534)
    out = shared / "run"
    assert main(["run", str(_experiment(tmp_path)), "--target-url", _dead_url(), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shared} is writable by" in err and "no sticky bit" in err, err
    assert "Traceback" not in err and not out.exists()


def test_an_out_under_another_users_directory_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    assert unsafe_parent(theirs / "run") == f"{theirs} belongs to uid 65534"
    with pytest.raises(UsageError, match="another user could swap the run directory"):
        prepare_private_dir(theirs / "run")
    # through a link of ours that leads there: the resolved path is checked too
    (tmp_path / "mine").symlink_to(theirs)
    assert str(unsafe_parent(tmp_path / "mine" / "run")).endswith("belongs to uid 65534")


def test_an_out_in_a_sticky_directory_is_taken_unless_another_user_owns_the_entry(tmp_path: Path) -> None:
    """/tmp (1777) stays usable: only an entry's owner may rename it there."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert unsafe_parent(sticky / "run") is None
    prepare_private_dir(sticky / "run")
    release_dir(sticky / "run")
    assert _mode(sticky / "run") == 0o700
    if os.geteuid() == 0:
        (sticky / "hers").mkdir(mode=0o755)
        os.chown(sticky / "hers", 65534, 65534)
        assert unsafe_parent(sticky / "hers" / "run") == f"{sticky / 'hers'} belongs to uid 65534"
