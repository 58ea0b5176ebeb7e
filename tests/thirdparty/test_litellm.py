"""The LiteLLM proxy with a master key in front of the builtin stack.

The key comes from the environment (`--api-key-env`), never from the experiment file, and is
written nowhere. LiteLLM is detected (its /health/liveliness); its /metrics needs the key too: with
the target's credentials the scrape succeeds, without them (`metrics_auth: none`) kv_cleanup's
inconclusive reason says "HTTP 401" and what to set, and the console says so while the run goes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from servers import EXPERIMENTS, LITELLM_KEY, Served, run_cli

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(400)


def _smoke(tmp_path: Path, **target: str) -> Path:
    raw = yaml.safe_load((EXPERIMENTS / "smoke.yaml").read_text())
    raw["target"].update(target)
    raw["phases"][0]["duration"] = "4s"
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_smoke_through_litellm_with_the_key_from_the_environment(litellm_proxy: Served, builtin_stack: StackProcess,
                                                                  tmp_path: Path) -> None:
    # KV series come from the engine behind the gateway: metrics_url points at the stack
    experiment = _smoke(tmp_path, metrics_url=builtin_stack.metrics_url)
    out = run_cli("run", str(experiment), "--target-url", litellm_proxy.url + "/v1",
                  "--api-key-env", "LITELLM_TEST_KEY", "--out", str(tmp_path / "run"),
                  env={"LITELLM_TEST_KEY": LITELLM_KEY})
    text = out.stdout + out.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["target"]["engine"]["profile"] == "litellm", report["target"]
    verdicts = {v["sla"]: v for v in report["verdicts"]}
    for sla in ("early_close", "errors", "integrity", "streaming", "kv_cleanup"):
        assert verdicts[sla]["status"] == "pass", (sla, verdicts[sla]["evidence"], text)
    assert LITELLM_KEY not in text
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert LITELLM_KEY.encode() not in path.read_bytes(), path


def test_a_metrics_scrape_refused_401_is_named_in_the_verdict_and_on_the_console(litellm_proxy: Served,
                                                                                 tmp_path: Path) -> None:
    experiment = _smoke(tmp_path, metrics_auth="none")
    out = run_cli("run", str(experiment), "--target-url", litellm_proxy.url + "/v1",
                  "--api-key-env", "LITELLM_TEST_KEY", "--out", str(tmp_path / "run"),
                  env={"LITELLM_TEST_KEY": LITELLM_KEY})
    assert "!! metrics: scraping" in out.stderr and "HTTP 401" in out.stderr, out.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    kv = next(v for v in report["verdicts"] if v["sla"] == "kv_cleanup")
    assert kv["status"] == "inconclusive"
    assert "HTTP 401 (unauthorised: set target.metrics_auth" in kv["evidence"]["reason"], kv["evidence"]
