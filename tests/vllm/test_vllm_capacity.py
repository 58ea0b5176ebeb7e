"""`streamchaos capacity` against real vLLM on CPU, where the capacity is known: with 2 batch slots
(``--max-num-seqs 2``) a third stream in flight waits for a slot, so TTFT p50 goes from ~24 ms at 2
streams to ~170 ms at 3 (measured here, 48-96-token streams); a 80 ms budget between the two makes
2 streams the capacity on any CPU within 2x of this one. Each probe builds vLLM afresh (about 40 s
here, 2-3x that beside a busy neighbour), so the search is kept to two probes: 2 streams, then the
bound, 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.host.procguard import group_members

ROOT = Path(__file__).resolve().parents[2]
# Opt in (STREAMCHAOS_TEST_VLLM_CAPACITY=1): beside CI's other xdist worker on 2 cores, vLLM's TTFT
# p50 at 1 and 2 streams stayed undecided against 80 ms (each probe lengthened once, 325 s, exit 1),
# so the test could not tell a right search from a wrong one there. Alone it passes: [2, 3), 92 s.
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(os.environ.get("STREAMCHAOS_TEST_VLLM_CAPACITY") != "1",
                                 reason="opt-in (STREAMCHAOS_TEST_VLLM_CAPACITY=1): needs the box to itself; "
                                        "beside a busy worker vLLM's TTFT is undecided at every level")]

EXPERIMENT = """
name: capacity-vllm-truth
seed: 1
target: {kind: vllm, model: tiny, max_num_seqs: 2, startup_timeout: 5m}
load: {max_tokens: [48, 96]}
phases:
  - {name: baseline, duration: 4s}
sla:
  - {kind: ttft, quantile: p50, budget: 80ms}
  - {kind: errors, budget: 0%}
capacity:
  min: 1
  max: 3
  start: 2
  probe: 6s
  warmup: 2s
  max_probe: 12s
  budget: 8m
  min_capacity: 2
"""


def test_the_search_finds_vllms_batch_slots_as_the_capacity(vllm_python: str, tmp_path: Path) -> None:
    experiment = tmp_path / "capacity.yaml"
    experiment.write_text(EXPERIMENT)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "chaos.cli", "capacity", str(experiment), "--out", str(out)],
                          capture_output=True, text=True, timeout=560, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    (case,) = json.loads((out / "capacity.json").read_text())["cases"]
    assert case["capacity"] == {"passing": 2.0, "failing": 3.0}, case["probes"]
    assert case["bound_by"] == ["ttft"] and case["resolved"] is True
    for probe in case["probes"]:
        run_dir = Path(probe["run_dir"])
        report = json.loads((run_dir / "report.json").read_text())
        assert report["environment"]["target"]["kind"] == "vllm"
        groups = [json.loads(line)["undo"]["pgid"] for line in (run_dir / "journal.jsonl").read_text().splitlines()
                  if '"kind":"process.group"' in line and '"action":"plan"' in line]
        assert groups and not [pid for pgid in groups for pid in group_members(pgid)]  # each probe's vLLM is gone
    passed = [p["verdicts"]["ttft"]["figure"] for p in case["probes"] if p["outcome"] == "pass"]
    assert passed and max(passed) < 0.08
