"""`streamchaos report RUN_DIR --as vllm-bench` and the metric definitions `list slas` shows:
figures computed the way vLLM's `bench serve` computes them, from known stamps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chaos.cli import main
from chaos.model.observations import NS, ErrorInfo, Hangup, Observations, PhaseWindow, StreamRecord
from chaos.output.vllm_bench import vllm_bench_figures

pytestmark = pytest.mark.timeout(30)

MS = 1_000_000
T0 = 5000 * NS


def stream(i: int, ttft_ms: int, gaps_ms: list[int], **extra: object) -> StreamRecord:
    sent = T0 + i * 100 * MS
    stamps = [sent + ttft_ms * MS]
    for gap in gaps_ms:
        stamps.append(stamps[-1] + gap * MS)
    return StreamRecord(id=f"r{i}", phase="steady", t_sent=sent, t_first_content=stamps[0], t_content=stamps,
                        t_end=stamps[-1] + MS, status=200, finish_reason="length", done_seen=True, **extra)  # type: ignore[arg-type]


def observations() -> Observations:
    streams = [
        stream(0, 40, [10, 10, 10]),  # 4 tokens: TPOT 10, E2EL 70
        stream(1, 60, [20, 20]),  # 3 tokens: TPOT 20, E2EL 100
        stream(2, 50, [10, 30], usage={"completion_tokens": 5}),  # 5 tokens in 3 events: TPOT 40/4 = 10
        stream(3, 30, []),  # 1 token: no TPOT, no ITL
        StreamRecord(id="fail", phase="steady", t_sent=T0, t_end=T0 + MS, status=503,
                     error=ErrorInfo("http", "HTTP 503", 503)),
        StreamRecord(id="gone", phase="steady", t_sent=T0, t_end=T0 + 5 * MS,
                     hangup=Hangup("client.disconnect", "while_queued", T0 + 5 * MS)),
    ]
    return Observations(experiment="views", t0=T0, streams=streams, phases=[PhaseWindow("steady", T0, T0 + NS)])


def test_figures_follow_vllm_bench_serve() -> None:
    f = vllm_bench_figures(observations())
    assert (f["successful_requests"], f["failed_requests"], f["hung_up_by_client_faults"]) == (4, 1, 1)
    assert f["total_generated_tokens"] == 4 + 3 + 5 + 1
    # duration: first send (T0) to the last content of a successful request (r3: 300 + 30 ms)
    assert f["benchmark_duration_s"] == pytest.approx(0.33)
    assert f["request_throughput"] == pytest.approx(4 / 0.33)
    assert f["output_throughput"] == pytest.approx(13 / 0.33)
    assert f["ttft_ms"]["mean"] == pytest.approx(45.0) and f["ttft_ms"]["median"] == pytest.approx(45.0)
    assert f["tpot_ms"]["mean"] == pytest.approx(np.mean([10, 20, 10]))  # single-token requests have none
    itls = [10, 10, 10, 20, 20, 10, 30]
    assert f["itl_ms"]["mean"] == pytest.approx(np.mean(itls))
    assert f["itl_ms"]["p99"] == pytest.approx(np.percentile(itls, 99))
    assert f["e2el_ms"]["median"] == pytest.approx(np.median([70, 100, 90, 30]))


def test_report_as_vllm_bench_prints_its_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    observations().dump(run_dir / "journal.jsonl")
    assert main(["report", str(run_dir), "--as", "vllm-bench"]) == 0
    out = capsys.readouterr().out
    for label in ("Successful requests:", "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):",
                  "Mean E2EL (ms):", "Request throughput (req/s):", "Output token throughput (tok/s):"):
        assert label in out
    assert "Mean TTFT (ms):                          45.00" in out
    assert main(["report", str(run_dir), "--as", "vllm-bench", "--phase", "nope"]) == 2  # a usage error: no such phase
    assert "no phase 'nope'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "--as", "vllm-bench"]) == 2  # a usage error: not a run directory
    assert main(["report", str(run_dir), "--as", "other"]) == 2


def test_list_slas_names_each_metric_with_its_stamps_and_other_tools_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "slas"]) == 0
    out = capsys.readouterr().out
    assert "goodput" in out and "fluidity" in out
    section = out[out.index("Metric definitions"):]
    assert "tpot  time per output token" in section
    assert "(t_tokens[-1] - t_first_token) / (tokens - 1)" in section
    assert "AIPerf:            Inter Token Latency (ITL)" in section
    assert "vLLM bench serve:  ITL" in section
