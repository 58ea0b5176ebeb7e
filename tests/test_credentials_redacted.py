"""No configured credential is recorded or printed, even when the target echoes it (issue 23 point 5).

A real server process (tests/echo_auth_server.py) puts the request's ``Authorization`` header into
its stream text, its error bodies, its headers and ``/metrics``. After a run against it, no file of
the run directory and nothing on the console holds the API key; a metrics_url the allow-list does
not allow is scraped without it; URL userinfo is stripped from the report.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.cli import main
from chaos.host.redact import MARK, redact, register_secret, strip_userinfo

pytestmark = pytest.mark.timeout(120)
SERVER = Path(__file__).parent / "echo_auth_server.py"


@pytest.fixture
def echo_port() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), line
        yield int(line.split()[1])
    finally:
        proc.kill()
        proc.wait(10)


def _run(tmp_path: Path, port: int, key: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         metrics_url: str) -> tuple[Path, str]:
    monkeypatch.setenv("ECHO_KEY", key)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "echo-auth",
        "target": {"metrics_url": metrics_url},
        "load": {"concurrency": 2, "max_tokens": 3},
        "phases": [{"name": "steady", "duration": "1500ms"}],
        "sla": [{"kind": "errors", "budget": "0%"}, {"kind": "ttft", "quantile": "p50", "budget": "5s"}],
        "safety": {"cleanup_window": "100ms", "scrape_interval": "200ms"},
    }), encoding="utf-8")
    out = tmp_path / "run"
    code = main(["run", str(exp), "--target-url", f"http://127.0.0.1:{port}/v1", "--api-key-env", "ECHO_KEY",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code in (1, 3, 4), captured.out[-2000:] + captured.err[-2000:]
    return out, captured.out + captured.err


def _seen(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/seen", timeout=10) as r:
        return json.loads(r.read())


def test_an_echoed_api_key_is_in_no_run_file_and_not_on_the_console(
        tmp_path: Path, echo_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    key = "sk-echo-" + secrets.token_hex(12)
    out, console = _run(tmp_path, echo_port, key, monkeypatch, capsys,
                        metrics_url=f"http://scrape:hunter22@127.0.0.1:{echo_port}/metrics")
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"journal.jsonl", "report.json", "report.html", "junit.xml"} <= set(files)
    journal = files["journal.jsonl"].decode()
    assert MARK in journal  # the server did echo it (the test is not vacuous), and it was redacted
    # the experiment copy is what its author wrote (0600, for `verify`): userinfo written there stays there
    leaks = [name for name, data in files.items()
             if key.encode() in data or (b"hunter22" in data and name != "experiment.yaml")]
    assert leaks == [] and key not in console and "hunter22" not in console
    assert _seen(echo_port)["metrics_with_auth"] > 0  # loopback: the metrics credential is sent


def test_a_metrics_url_the_allow_list_does_not_allow_gets_no_credential(
        tmp_path: Path, echo_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # 0.0.0.0 reaches this host's listeners on Linux, but is not loopback by name: not allowed
    out, _ = _run(tmp_path, echo_port, "sk-echo-" + secrets.token_hex(12), monkeypatch, capsys,
                  metrics_url=f"http://0.0.0.0:{echo_port}/metrics")
    seen = _seen(echo_port)
    assert seen["metrics_with_auth"] == 0 and seen["metrics_without"] > 0, seen
    assert "withheld" in (out / "journal.jsonl").read_text()


def test_the_redactor_removes_secrets_in_every_form_and_url_userinfo() -> None:
    secret = 'tok<en>"&' + secrets.token_hex(4)
    register_secret(secret)
    text = f"{secret} {json.dumps(secret)} {secret.replace('<', '&lt;').replace('>', '&gt;').replace('&', '&amp;', 0)}"
    assert secret not in redact(text) and json.dumps(secret)[1:-1] not in redact(text)
    assert strip_userinfo("see http://u:p%40ss@h:1/x and https://tok@h/") == "see http://h:1/x and https://h/"
    register_secret("abc")  # too short to redact without mangling ordinary text
    assert redact("abc") == "abc"


def test_the_admin_tokens_a_run_makes_for_its_targets_are_redacted(tmp_path: Path) -> None:
    """A builtin stack in a container and vLLM with the middleware inside get a fresh admin token per
    run; each is redacted from then on, as a configured one is (the token is in the container's or
    vLLM's environment, and a target that echoes it must not put it in a run file)."""
    from chaos.model.experiment import TargetSpec
    from chaos.targets.docker import DockerTarget
    from chaos.targets.vllm import VllmTarget

    docker = DockerTarget(TargetSpec(kind="docker"), run_dir=tmp_path, seed=1, run_id="redact", record=None)
    assert docker.token and redact(f"echoed {docker.token}") == f"echoed {MARK}"
    vllm = VllmTarget.__new__(VllmTarget)  # its constructor looks for a vLLM install; the token needs none
    vllm.spec, vllm._token = TargetSpec(kind="vllm"), None
    token = vllm.run_admin_token()
    assert token == vllm.run_admin_token()  # one per run, kept across a restart
    assert redact(f'{{"token": "{token}"}}') == f'{{"token": "{MARK}"}}'
