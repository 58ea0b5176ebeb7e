"""scripts/gpu-check's dry run passes on CPU (nothing started), and the rewrite it makes is the one it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from vllm_check import for_vllm  # noqa: E402


def test_the_rewrite_targets_vllm_and_turns_reserve_into_hog() -> None:
    kv = yaml.safe_load((ROOT / "experiments" / "kv-pressure.yaml").read_text())
    out, why = for_vllm(kv, "cuda")
    assert out is not None and why == ""
    assert out["target"]["kind"] == "vllm" and out["target"]["device"] == "cuda"
    fault = out["phases"][1]["faults"][0]
    assert fault["method"] == "hog" and "fraction" not in fault
    assert kv["phases"][1]["faults"][0]["method"] == "reserve"  # the shipped experiment is left as it was
    assert out["phases"][1]["duration"] == kv["phases"][1]["duration"]  # on CUDA the hog's phase is as shipped
    on_cpu, _ = for_vllm(kv, "cpu")
    # at least 15 s: enough TTFTs under the hog (the shipped phase runs until decided, 6 s to 20 s)
    assert kv["phases"][1]["duration"] == {"min": "6s", "max": "20s"}
    assert on_cpu is not None and on_cpu["phases"][1]["duration"] == {"min": "15s", "max": "20s"}
    smoke = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    scaled, _ = for_vllm(smoke, "cpu", latency_scale=4.0)
    assert scaled is not None
    budgets = {e["kind"]: e.get("budget") for e in scaled["sla"]}
    assert budgets["ttft"] == "2s" and budgets["itl"] == "1s" and budgets["errors"] == "0%"  # 500ms, 250ms x 4
    steps = yaml.safe_load((ROOT / "experiments" / "server-timeouts.yaml").read_text())
    assert for_vllm(steps, "cpu")[0] is None and "engine_step" in for_vllm(steps, "cpu")[1]


def test_the_gpu_check_dry_run_passes_on_cpu_and_starts_nothing(vllm_python: str, tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/gpu-check", "--dry-run", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "vllm-check.json").read_text())
    assert summary["device"] == "cuda" and summary["dry_run"]
    rows = {r["experiment"]: r for r in summary["experiments"]}
    assert set(rows) == {"smoke", "disconnect-storm", "vllm-server-faults", "kv-pressure"}
    assert all(r["applies"] and r["validate_exit"] == 0 and r["dry_run_exit"] == 0 for r in rows.values()), rows
    assert not any(p.is_dir() for p in tmp_path.iterdir()), "a dry run made a run directory"
