"""nginx (Debian's) in front of the builtin stack: `smoke.yaml` catches a buffering proxy.

With nginx's buffering (HTTP/1.0 to the upstream, proxy_buffering on, the upstream's
X-Accel-Buffering ignored) each stream arrives whole: TTFT near end-to-end, all events in one or
two reads. `ttft`'s budget alone still passes it (the issue that filed this); the `streaming`
verdict fails it and says the responses are buffered, so smoke exits 1. Unbuffered (proxy_buffering
off, HTTP/1.1), the same experiment exits 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.stack.process import StackProcess
from servers import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.thirdparty, pytest.mark.timeout(300)]


def _run(url: str, experiment: str, out: Path) -> tuple[int, dict, str]:
    done = run_cli("run", experiment, "--target-url", url + "/v1", "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return done.returncode, report, done.stdout + done.stderr


def _verdict(report: dict, sla: str) -> dict:
    return next(v for v in report["verdicts"] if v["sla"] == sla)


def test_smoke_fails_behind_a_buffering_nginx(builtin_stack: StackProcess, nginx: Callable[[str, str], str], tmp_path: Path) -> None:
    code, report, text = _run(nginx(builtin_stack.url, "buffering"), "experiments/smoke.yaml", tmp_path / "run")
    streaming = _verdict(report, "streaming")
    assert streaming["status"] == "fail", streaming
    assert "being buffered" in streaming["evidence"]["reason"]
    assert streaming["evidence"]["events_per_read_p50"] >= 8  # the stream came in a few big pieces
    assert streaming["evidence"]["first_share_p50"] > 0.5  # ... the first one late
    assert _verdict(report, "ttft")["status"] == "pass"  # the point: the ttft budget alone lets it through
    assert code == 1, text
    assert report["target"]["engine"]["profile"] == "builtin"  # recognised through the proxy by its /health


def test_smoke_passes_behind_an_unbuffered_nginx(builtin_stack: StackProcess, nginx: Callable[[str, str], str], tmp_path: Path) -> None:
    code, report, text = _run(nginx(builtin_stack.url, "streaming"), "experiments/smoke.yaml", tmp_path / "run")
    assert _verdict(report, "streaming")["status"] == "pass"
    assert code == 0, text


def test_real_proxy_buffering_experiment_names_the_buffering_nginx(builtin_stack: StackProcess,
                                                                    nginx: Callable[[str, str], str], tmp_path: Path) -> None:
    code, report, text = _run(nginx(builtin_stack.url, "buffering"), "experiments/real-proxy-buffering.yaml", tmp_path / "run")
    assert code == 1, text
    assert _verdict(report, "streaming")["status"] == "fail"
