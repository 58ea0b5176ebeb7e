"""The same experiment against the same healthy stack passes over HTTP/1.1 and over HTTP/2 with TLS,
the records say which protocol carried each stream, and ``report --compare`` of the two runs names the
protocol as the difference. The builtin stack serves both on one port (``target: {tls: true, http: 2}``:
Hypercorn, h2 by ALPN, HTTP/1.1 to a client that offers only that). A whole run each: the slow tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import main

pytestmark = pytest.mark.timeout(240)


def _experiment(version: str) -> dict[str, Any]:
    return {
        "name": "protocols",
        "seed": 7,
        "target": {"kind": "builtin", "model": "tiny", "tls": True, "http": 2},
        "load": {"concurrency": 4, "max_tokens": [16, 32], "request_timeout": "20s",
                 "http": {"version": version, "streams_per_connection": 4}},
        "phases": [{"name": "steady", "duration": {"min": "3s", "max": "15s"}}],
        "sla": [
            {"kind": "early_close", "budget": "0%"},
            {"kind": "integrity"},
            {"kind": "ttft", "quantile": "p50", "budget": "500ms"},
            {"kind": "itl", "quantile": "p50", "budget": "100ms"},
        ],
        "safety": {"max_duration": "1m", "drain_timeout": "10s", "cleanup_window": "1s"},
    }


def test_one_experiment_passes_over_http11_and_http2_and_compare_names_the_protocol(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.api import run
    from chaos.experiment import experiment_from_dict

    results = {}
    for version in ("1.1", "2"):
        run_dir = tmp_path / f"http{version}"
        result = run(experiment_from_dict(_experiment(version)), out_dir=run_dir, handle_signals=False)
        assert result.status == "completed", result.error
        assert {v.sla: v.status for v in result.verdicts} == dict.fromkeys(
            ("early_close", "integrity", "ttft", "itl"), "pass"), [v.evidence.get("reason") for v in result.verdicts]
        streams = result.observations.population(None)
        assert streams and all(st.t_tls is None or st.t_connected <= st.t_tls for st in streams)
        results[version] = (run_dir, streams, json.loads((run_dir / "report.json").read_text()))

    _, h1_streams, h1_report = results["1.1"]
    _, h2_streams, h2_report = results["2"]
    assert {st.protocol for st in h1_streams} == {"http/1.1"}
    assert {st.protocol for st in h2_streams} == {"h2"}
    # HTTP/1.1: a connection per slot; HTTP/2: the four slots' streams share one connection
    assert h1_report["load"]["connections"] >= 4 > h2_report["load"]["connections"] >= 1
    assert len({st.stream_id for st in h2_streams}) == len(h2_streams)
    # each new connection paid its TLS handshake, and ttft's evidence takes it apart
    ttft = next(v for v in h2_report["verdicts"] if v["sla"] == "ttft")
    parts = ttft["evidence"]["ttft_parts"]
    assert set(parts["protocols"]) == {"h2"} and parts["new_connections"] >= 1
    assert parts["tls"]["p50"] > 0 and parts["head_to_token"]["p50"] > 0

    capsys.readouterr()
    main(["report", "--compare", str(results["1.1"][0]), str(results["2"][0])])
    out = capsys.readouterr().out
    assert "setup differs: load protocol: http/1.1 (A) vs h2 (B)" in out
