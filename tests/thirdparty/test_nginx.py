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
import yaml
from servers import run_cli

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(300)


def _run(url: str, experiment: str, out: Path) -> tuple[int, dict, str]:
    done = run_cli("run", experiment, "--target-url", url + "/v1", "--out", str(out), "--quiet")
    report = json.loads((out / "report.json").read_text())
    return done.returncode, report, done.stdout + done.stderr


def _verdict(report: dict, sla: str) -> dict:
    return next(v for v in report["verdicts"] if v["sla"] == sla)


def test_smoke_fails_behind_a_buffering_nginx(builtin_stack: StackProcess, nginx: Callable[[str, str], str],
                                              tmp_path: Path) -> None:
    # smoke's own SLAs, its ttft p75 within 500 ms made a p50 within 5 s: behind this nginx a TTFT is a
    # whole 32-token response, which beside busy neighbours came near 500 ms (a CI run read ttft
    # inconclusive); 5 s is a budget every buffered response meets on any box. And a p50: whole
    # responses drift together, so beside two busy processes and the suite 228 TTFTs were worth 12
    # independent ones (tau 19), one short of what bounds a p75 and twice what bounds a p50. So the
    # point stands decided: ttft passes, streaming fails. 16 s, not smoke's 8: a CI run beside two busy
    # processes read the p50 inconclusive (too few independent TTFTs in 8 s, every one far inside 5 s).
    # Until decided, 6 s to 30 s, not a fixed 16 s: a quiet box decides at its first look (the suite's time),
    # a busy one gets more than 16 s for the looks' price in samples
    generous = tmp_path / "smoke-generous-ttft.yaml"
    smoke = Path("experiments/smoke.yaml").read_text()
    assert "quantile: p75\n    budget: 500ms" in smoke and "duration: 8s\n" in smoke
    generous.write_text(smoke.replace("quantile: p75\n    budget: 500ms", "quantile: p50\n    budget: 5s", 1)
                        .replace("duration: 8s\n", "duration: {min: 6s, max: 30s}\n", 1))
    code, report, text = _run(nginx(builtin_stack.url, "buffering"), str(generous), tmp_path / "run")
    streaming = _verdict(report, "streaming")
    assert streaming["status"] == "fail", streaming
    assert "being buffered" in streaming["evidence"]["reason"]
    assert streaming["evidence"]["events_per_read_p50"] >= 8  # the stream came in a few big pieces
    assert streaming["evidence"]["first_share_p50"] > 0.5  # ... the first one late
    ttft = _verdict(report, "ttft")
    assert ttft["status"] == "pass", ttft["evidence"]  # the point: the ttft budget alone lets it through
    assert code == 1, text
    assert report["target"]["engine"]["profile"] == "builtin"  # recognised through the proxy by its /health


def test_smoke_passes_behind_an_unbuffered_nginx(builtin_stack: StackProcess, nginx: Callable[[str, str], str],
                                                 tmp_path: Path) -> None:
    code, report, text = _run(nginx(builtin_stack.url, "streaming"), "experiments/smoke.yaml", tmp_path / "run")
    streaming = _verdict(report, "streaming")
    seen = (streaming["evidence"], report["load"].get("client_lag"), report["host"])
    # never a fail. CI read `fail` here three times, the host saturated (2.0 of 2 cores busy): 24 of 178, 79 of
    # 154 and 39 of 261 streams came 8 or more events a read, bunched by a starved host; a buffer holds every
    # stream, so that is undecided there (sla/streaming.py), and decided on a box with CPU to spare
    if streaming["status"] == "inconclusive":
        assert streaming["evidence"]["inconclusive_cause"] == "host saturated", seen
        assert streaming["evidence"]["saturated_host"]["busy_cores"] >= 0.95 * report["host"]["cpus"], seen
        assert code == 3, text
        return
    assert streaming["status"] == "pass", seen
    assert code == 0, text


def test_real_proxy_buffering_experiment_names_the_buffering_nginx(builtin_stack: StackProcess,
                                                                   nginx: Callable[[str, str], str],
                                                                   tmp_path: Path) -> None:
    code, report, text = _run(nginx(builtin_stack.url, "buffering"), "experiments/real-proxy-buffering.yaml",
                              tmp_path / "run")
    assert code == 1, text
    assert _verdict(report, "streaming")["status"] == "fail"


def test_real_proxy_buffering_experiment_passes_the_streaming_nginx(builtin_stack: StackProcess,
                                                                    nginx: Callable[[str, str], str],
                                                                    tmp_path: Path) -> None:
    """The regression's fixed configuration (docs/support.md): proxy_buffering off, HTTP/1.1 upstream."""
    code, report, text = _run(nginx(builtin_stack.url, "streaming"), "experiments/real-proxy-buffering.yaml",
                              tmp_path / "run")
    assert code == 0, text
    assert _verdict(report, "streaming")["status"] == "pass"


def test_smoke_fails_behind_a_compressing_nginx_and_names_gzip(builtin_stack: StackProcess,
                                                              nginx: Callable[[str, str], str], tmp_path: Path) -> None:
    """nginx's gzip for event streams holds each stream whole, but only for a client that sends
    Accept-Encoding, as the OpenAI SDK does and the load client now does by default."""
    url = nginx(builtin_stack.url, "gzip")
    code, report, text = _run(url, "experiments/smoke.yaml", tmp_path / "run")
    streaming = _verdict(report, "streaming")
    assert streaming["status"] == "fail", streaming
    assert streaming["evidence"]["content_encoding"] == "gzip" and streaming["evidence"]["server"].startswith("nginx")
    assert "gzip off for text/event-stream" in streaming["evidence"]["reason"]
    assert streaming["evidence"]["first_share_p50"] > 0.5  # the first token came late, with the rest
    assert code == 1, text
    # the same nginx, a client that asks for no compression (the load client before it sent the
    # SDK's headers): the median stream flows, one or two events a read. Not asserted to pass: in
    # its buffered mode nginx bunches ~10% of streams on a loaded 2-core machine (measured 29 of 279).
    # Medians of the streams, no verdict to decide: 3 s of smoke's 4 streams (~40 of them) do, not the
    # whole of smoke's phase (8 s, then until decided: 20 s and more)
    plain = tmp_path / "identity.yaml"
    smoke = yaml.safe_load(Path("experiments/smoke.yaml").read_text())
    smoke["load"]["headers"] = {"Accept-Encoding": "identity"}
    smoke["phases"] = [{"name": "baseline", "duration": "3s"}]
    plain.write_text(yaml.safe_dump(smoke))
    _, report, _ = _run(url, str(plain), tmp_path / "identity")
    evidence = _verdict(report, "streaming")["evidence"]
    assert evidence["events_per_read_p50"] < 8 and evidence["first_read_share_p50"] < 0.5, evidence
    assert evidence["buffered"] < evidence["judged"] / 2, evidence
