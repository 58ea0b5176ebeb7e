"""`report --as llm-d` and `--as aiperf` on one real run of the builtin stack (a baseline, then a phase
with 100 ms of proxy latency and a client fault hanging up a share of the streams): each format
validates against its vendored schema (tests/reports/schemas/), its figures agree with report.json's
own, the faulted phase names its faults, and the CLI prints valid JSON (exit 0) or a usage error
(exit 2) for an unknown phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import chaos
from chaos.model.observations import Observations
from chaos.output.aiperf_export import aiperf_export
from chaos.output.llmd_report import llmd_reports
from chaos.output.phase_figures import phase_figures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # one whole run, read in each format

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SCHEMAS = HERE / "schemas"

EXPERIMENT = """\
name: result-formats-probe
seed: 7
target: {kind: builtin, model: tiny}
path: [{kind: toxiproxy, server: auto}]
load:
  concurrency: 3
  max_tokens: 16
phases:
  - name: baseline
    duration: 1500ms
  - name: slowed
    duration: 2s
    faults:
      - kind: network.latency
        name: added-latency
        latency: 100ms
      - kind: client.disconnect
        name: hangups
        fraction: 30%
        after_tokens: [2, 6]
sla:
  - kind: ttft
    phases: [baseline]
    quantile: p50
    budget: 2s
safety: {max_duration: 60s, cleanup_window: 500ms, scrape_interval: 200ms}
"""


def _schema(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / name).read_text()))


def _validate(doc: Any, schema_name: str) -> None:
    schema = _schema(schema_name)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("result-formats")
    (root / "exp.yaml").write_text(EXPERIMENT)
    result = chaos.run(root / "exp.yaml", out_dir=root / "run")
    assert result.exit_code == 0, result.status
    return root / "run"


@pytest.fixture(scope="module")
def obs(run_dir: Path) -> Observations:
    return Observations.load(run_dir / "journal.jsonl")


@pytest.fixture(scope="module")
def report(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


@pytest.fixture(scope="module")
def llmd(run_dir: Path, obs: Observations) -> dict[str, dict[str, Any]]:
    load = chaos.load_experiment(run_dir / "experiment.yaml").load
    return {r["scenario"]["load"]["metadata"]["treatment"]: r for r in llmd_reports(obs, load, "rid")}


def _aggregate(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["results"]["request_performance"]["aggregate"])


def test_llmd_reports_one_per_phase_and_validate(llmd: dict[str, dict[str, Any]]) -> None:
    assert list(llmd) == ["baseline", "slowed"]
    for doc in llmd.values():
        _validate(doc, "llmd_benchmark_report_v0_2_1.schema.json")
        assert doc["version"] == "0.2.1"
        stack = doc["scenario"]["stack"][0]["standardized"]
        assert stack["model"] == "tiny" and stack["base_url"].startswith("http://127.0.0.1:")


def test_llmd_ttft_agrees_with_the_verdict(llmd: dict[str, dict[str, Any]], report: dict[str, Any]) -> None:
    verdict = next(v for v in report["verdicts"] if v["sla"] == "ttft" and v["phase"] == "baseline")
    ttft = _aggregate(llmd["baseline"])["latency"]["time_to_first_token"]
    assert ttft["units"] == "ms"
    assert ttft["p50"] == pytest.approx(verdict["figure"] * 1e3, rel=1e-9)
    assert ttft["p90"] == pytest.approx(verdict["evidence"]["ttft"]["p90"] * 1e3, rel=1e-9)
    assert _aggregate(llmd["baseline"])["requests"]["total"] == verdict["samples"]


def test_llmd_counts_every_stream(llmd: dict[str, dict[str, Any]], obs: Observations) -> None:
    for phase, doc in llmd.items():
        requests = _aggregate(doc)["requests"]
        population = obs.population(phase)
        hung_up = sum(st.hangup is not None for st in population)
        assert requests["total"] == len(population)
        assert requests["incomplete"] >= hung_up
        if phase == "slowed":
            assert hung_up > 0  # the client fault hung up some, and they are counted, not dropped
        ok = round(_aggregate(doc)["throughput"]["request_rate"]["mean"] * phase_figures(obs, phase).duration_s)
        assert ok + requests["failures"] + requests["incomplete"] == requests["total"]


def test_llmd_faulted_phase_names_its_faults(llmd: dict[str, dict[str, Any]]) -> None:
    slowed, baseline = llmd["slowed"], llmd["baseline"]
    names = {f["name"] for f in slowed["scenario"]["load"]["native"]["config"]["faults"]}
    assert names == {"added-latency", "hangups"}
    assert {"fault:added-latency", "fault:hangups"} <= set(slowed["run"]["keywords"])
    assert baseline["scenario"]["load"]["native"]["config"]["faults"] == []
    slow_p50 = _aggregate(slowed)["latency"]["time_to_first_token"]["p50"]
    assert slow_p50 > 50 + _aggregate(baseline)["latency"]["time_to_first_token"]["p50"]  # the 100 ms shows


def test_aiperf_export_validates_and_agrees(obs: Observations, llmd: dict[str, dict[str, Any]]) -> None:
    for phase in ("baseline", "slowed"):
        doc = aiperf_export(obs, phase, "rid")
        _validate(doc, "aiperf_profile_export_v1_0.schema.json")
        requests = _aggregate(llmd[phase])["requests"]
        assert doc["request_count"]["avg"] + doc["error_request_count"]["avg"] == requests["total"]
        assert doc["time_to_first_token"]["unit"] == "ms"
        assert doc["time_to_first_token"]["p50"] == _aggregate(llmd[phase])["latency"]["time_to_first_token"]["p50"]
        # AIPerf's inter_token_latency is per request: llm-d's time_per_output_token
        tpot = _aggregate(llmd[phase])["latency"]["time_per_output_token"]
        assert doc["inter_token_latency"]["avg"] == pytest.approx(tpot["mean"])
        hangups = sum(e["count"] for e in doc["error_summary"] if e["error_details"]["type"] == "ClientHangup")
        assert hangups == doc["streamchaos"]["hung_up_by_client_faults"]
    whole = aiperf_export(obs, None)
    _validate(whole, "aiperf_profile_export_v1_0.schema.json")
    assert {f["name"] for f in whole["streamchaos"]["faults"]} == {"added-latency", "hangups"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", "report", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_cli_prints_json(run_dir: Path) -> None:
    llmd = _cli(str(run_dir), "--as", "llm-d")
    assert llmd.returncode == 0, llmd.stderr
    docs = json.loads(llmd.stdout)
    assert [d["run"]["keywords"][1] for d in docs] == ["phase:baseline", "phase:slowed"]
    for doc in docs:
        _validate(doc, "llmd_benchmark_report_v0_2_1.schema.json")
    one = _cli(str(run_dir), "--as", "llm-d", "--phase", "slowed")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["scenario"]["load"]["metadata"]["treatment"] == "slowed"
    aiperf = _cli(str(run_dir), "--as", "aiperf", "--phase", "baseline")
    assert aiperf.returncode == 0, aiperf.stderr
    _validate(json.loads(aiperf.stdout), "aiperf_profile_export_v1_0.schema.json")


def test_cli_unknown_phase_is_a_usage_error(run_dir: Path) -> None:
    for fmt in ("llm-d", "aiperf"):
        bad = _cli(str(run_dir), "--as", fmt, "--phase", "nope")
        assert bad.returncode == 2
        assert "no phase 'nope'" in bad.stderr and "baseline, slowed" in bad.stderr
        assert "Traceback" not in bad.stderr and bad.stdout == ""
