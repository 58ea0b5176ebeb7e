"""Issue 40: the content and framing defects a set of servers written outside the project slipped past
every shipped experiment, each planted in a builtin stack of our own (``planted_content.py``) and run
as a user would run it: ``streamchaos run experiments/smoke.yaml --target-url ...`` (a copy with its
phase a fixed 4 s and only the entries each case needs; without ``integrity`` for the framing every
run judges), asserting the verdict that must fail, or the preflight's exit 4 naming the Content-Type."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.stack.process import StackProcess

HERE = Path(__file__).parent
SMOKE = HERE.parents[1] / "experiments" / "smoke.yaml"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def planted_content() -> Iterator[Callable[..., str]]:
    """``planted_content("short_length")`` → the URL of a builtin stack with that defect."""
    stacks: list[StackProcess] = []

    def start(defect: str, *extra: str) -> str:
        stack = StackProcess.start(command=[sys.executable, str(HERE / "planted_content.py"), "--defect", defect,
                                            "--port", "0", *extra], timeout=60.0)
        stacks.append(stack)
        return stack.url

    yield start
    for stack in stacks:
        stack.close()


def smoke(tmp_path: Path, *kinds: str, **more: Any) -> Path:
    """The shipped smoke experiment with only its SLA entries of ``kinds``, its phase a fixed 4 s (the
    shipped one runs until its p99 tail decides, 20 s and more) and no kv_cleanup (whose window would
    add 3 s): each run here takes ~12 s beside the planted stack's start."""
    exp = yaml.safe_load(SMOKE.read_text())
    exp["phases"] = [{"name": "baseline", "duration": "4s"}]
    exp["sla"] = [e for e in exp["sla"] if "name" not in e and e["kind"] in kinds]
    exp["safety"]["cleanup_window"] = "200ms"
    exp.update(more)
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(exp), encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], experiment: Path, url: str, out: Path, *more: str) -> tuple[int, str]:
    """``streamchaos run`` as a user types it, in this process (``chaos.cli.main``, what ``python -m chaos``
    runs; a CLI process costs seconds of imports on a busy box): its exit code, its stdout and stderr."""
    from chaos.cli import main

    capsys.readouterr()
    code = main(["run", str(experiment), "--target-url", url, "--out", str(out), "--quiet", *more])
    said = capsys.readouterr()
    return code, said.out + said.err


def run_file(experiment: Path, url: str, out: Path) -> int:
    """The run in this process (the front door ``chaos.run``, as the CLI calls it; a CLI process costs
    ~6 s of imports on a busy box): its exit code, its report.json under ``out``."""
    from chaos.api import run

    return run(experiment, target_url=url, out_dir=out, handle_signals=False).exit_code


def verdict(out: Path, kind: str) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    return next(v for v in report["verdicts"] if v["sla"] == kind)


def test_events_sent_twice_fail_integrity_against_the_servers_own_usage(planted_content: Any, tmp_path: Path) -> None:
    assert run_file(smoke(tmp_path, "integrity", "errors"), planted_content("duplicate_events"), tmp_path / "run") == 1
    integrity = verdict(tmp_path / "run", "integrity")
    assert integrity["status"] == "fail" and integrity["evidence"]["problems"]["events_over_usage"] > 0, integrity
    assert integrity["evidence"]["repeated_events"] > 0
    assert "usage.completion_tokens" in integrity["evidence"]["reason"]


def test_a_stream_cut_short_with_finish_reason_length_fails_early_close(planted_content: Any, tmp_path: Path) -> None:
    assert run_file(smoke(tmp_path, "early_close", "integrity"), planted_content("short_length"), tmp_path / "run") == 1
    early = verdict(tmp_path / "run", "early_close")
    assert early["status"] == "fail" and early["evidence"]["by_cause"].get("short_length", 0) > 0, early
    assert "after 25 of max_tokens 32 (usage.completion_tokens)" in early["evidence"]["offenders"][0]["detail"]


def test_streams_served_as_json_fail_a_run_that_does_not_list_integrity(planted_content: Any, tmp_path: Path) -> None:
    """Framing is judged on every run: ``errors`` and ``early_close`` name the Content-Type (the first
    response, the preflight's, goes out right, so the run gets past the preflight; one in three after
    it goes out as application/json, so the run is not halted as a dead target either)."""
    url = planted_content("json_content_type", "--json-every", "3")
    assert run_file(smoke(tmp_path, "ttft", "errors", "early_close"), url, tmp_path / "run") == 1
    errors = verdict(tmp_path / "run", "errors")
    assert errors["status"] == "fail" and errors["evidence"]["by_kind"] == {"protocol": errors["evidence"]["failed"]}
    assert "Content-Type 'application/json'" in errors["evidence"]["first"][0]["message"], errors
    early = verdict(tmp_path / "run", "early_close")
    assert early["status"] == "fail" and "application/json" in early["evidence"]["offenders"][0]["error"]


@pytest.mark.parametrize(("defect", "extra", "named"), [
    ("html_everywhere", (), "Content-Type 'text/html; charset=utf-8'"),
    ("json_content_type", ("--json-from", "1"), "Content-Type 'application/json'"),
])
def test_the_preflight_refuses_a_target_whose_answer_is_not_an_event_stream(
        planted_content: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], defect: str,
        extra: tuple[str, ...], named: str) -> None:
    url = planted_content(defect, *extra)
    code, said = cli(capsys, smoke(tmp_path, "integrity"), url, tmp_path / "run")
    assert code == 4, said
    assert named in said and "not an event stream" in said
    from chaos.cli import main

    assert main(["run", str(SMOKE), "--target-url", url, "--out", str(tmp_path / "dry"), "--quiet", "--dry-run"]) == 4
    dry = capsys.readouterr().out
    assert named in dry and "could go ahead" not in dry, dry


def test_a_gzip_the_origin_does_is_told_as_the_targets_own(planted_content: Any, tmp_path: Path) -> None:
    assert run_file(smoke(tmp_path, "ttft", "streaming"), planted_content("gzip_origin"), tmp_path / "run") == 1
    streaming = verdict(tmp_path / "run", "streaming")
    reason = streaming["evidence"]["reason"]
    assert streaming["status"] == "fail" and streaming["evidence"]["content_encoding"] == "gzip", streaming
    assert "the target's own answer" in reason and "nginx" not in reason and "a hop in front" not in reason, reason


@pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="no nginx here")
def test_a_gzip_the_origin_does_behind_the_runs_own_nginx_is_not_put_on_nginx(
        planted_content: Any, tmp_path: Path) -> None:
    """The same origin behind an nginx the run starts itself (its shipped streaming configuration, gzip
    off): the advice knows nginx does not compress, and says the server behind it does."""
    exp = smoke(tmp_path, "streaming", path=[{"kind": "nginx", "name": "edge"}])
    assert run_file(exp, planted_content("gzip_origin"), tmp_path / "run") == 1
    streaming = verdict(tmp_path / "run", "streaming")
    reason = streaming["evidence"]["reason"]
    assert streaming["status"] == "fail" and streaming["evidence"]["server"].startswith("nginx"), streaming
    assert "has gzip off: the server behind it compresses it" in reason and "set gzip off" not in reason, reason
