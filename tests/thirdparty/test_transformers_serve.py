"""`transformers serve` with the builtin tiny model exported as a Hugging Face Llama checkpoint.

The shipped experiments run against it unchanged and judge it right: its 422 on `ignore_eos` is
caught at the preflight (the field dropped, the profile detected from the refusal), its streams
end without `[DONE]` and still count as complete, and `kv_cleanup` is unobservable because it has
no `/metrics` (and says so), never a false failure. TTFT and ITL are the server's real speed
(one request at a time on a shared CPU): they are reported, not asserted. With sampling on and
nothing suppressed, the streamed text is still whole characters: the export's weights see to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from servers import Served, run_cli

pytestmark = pytest.mark.timeout(400)

TIMING = {"ttft", "itl", "fluidity"}  # the server's real speed (fluidity: a pace): printed, not asserted here


def _fixed_length(experiment: str, tmp_path: Path) -> Path:
    """The shipped experiment with each phase that runs until decided held to its min: this engine's TTFT
    (one request at a time) never decides a budget set for a batching engine, so those phases ran to
    their max (disconnect-storm 78 s in CI instead of 30 s) while timing is not asserted here."""
    raw = yaml.safe_load((Path(__file__).parents[2] / "experiments" / f"{experiment}.yaml").read_text())
    for phase in raw["phases"]:
        if isinstance(phase.get("duration"), dict):
            phase["duration"] = phase["duration"]["min"]
        phase.pop("until", None)
    path = tmp_path / f"{experiment}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _verdicts(run: Path) -> dict[str, dict]:
    report = json.loads((run / "report.json").read_text())
    return {f"{v['name']}@{v['phase'] or 'run'}": v for v in report["verdicts"]}


@pytest.mark.parametrize("experiment", ["smoke", "disconnect-storm", "network-jitter"])
def test_shipped_experiments_judge_transformers_serve_right(transformers_serve: Served, tmp_path: Path,
                                                            experiment: str) -> None:
    run = tmp_path / "run"
    out = run_cli("run", str(_fixed_length(experiment, tmp_path)), "--target-url", transformers_serve.url + "/v1",
                  "--out", str(run), "--quiet")
    assert out.returncode in (0, 1, 3), out.stdout + out.stderr  # it ran: no setup failure
    report = json.loads((run / "report.json").read_text())
    engine = report["target"]["engine"]
    assert engine["profile"] == "transformers-serve", engine
    assert "Unexpected fields in the request" in engine["detected_by"]
    assert engine["end_of_stream"] == {"finish_reason": True, "done": False}
    assert list(engine["dropped_fields"]) == ["ignore_eos"]
    verdicts = _verdicts(run)
    print(out.stdout)
    for key, v in verdicts.items():
        if v["sla"] in TIMING:
            continue
        if v["sla"] in ("kv_cleanup", "abort_propagation"):  # both read metrics: none to read, said so
            assert v["status"] == "unobservable" and v["ok"] and v["when_unobservable"] == "tolerate", v
            reason = v["evidence"]["reason"]
            assert reason.startswith("transformers serve exports no Prometheus metrics"), reason
            assert "metrics_url" not in reason, reason
            continue
        if v["sla"] == "streaming" and v["status"] == "inconclusive":
            # a serial engine on a saturated host bunches a few streams (11% of 97 beside the suite and two
            # busy processes), none with a buffer's mark: undecided there, never a fail
            assert v["evidence"]["inconclusive_cause"] == "host saturated", v["evidence"]
            continue
        assert v["status"] == "pass", (key, v["figure"], v["evidence"])
    assert report["load"]["complete"] > 0


def test_sampled_streams_are_valid_utf8(transformers_serve: Served, tiny_checkpoint: Path) -> None:
    """Temperature 1 with a request's own generation config: it replaces the checkpoint's, and
    ``suppress_tokens: []`` keeps generate from filling one in, so only the weights stand between
    the sampler and a byte-fragment token (the earlier export streamed U+FFFD in 8 of 8 here)."""
    sampling = json.dumps({"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "suppress_tokens": [],
                           "max_new_tokens": 64})
    texts: list[str] = []
    with httpx.Client(trust_env=False, timeout=60.0) as client:
        for i, prompt in enumerate(["Hello world", "今天天气很好", "🚀 launch 🌕😀", "서버는 안정적"]):
            body = {"model": str(tiny_checkpoint), "messages": [{"role": "user", "content": prompt}], "stream": True,
                    "max_tokens": 64, "temperature": 1.0, "seed": i, "generation_config": sampling}
            text = ""
            with client.stream("POST", transformers_serve.url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for choice in json.loads(line[6:]).get("choices") or []:
                            text += (choice.get("delta") or {}).get("content") or ""
            texts.append(text)
    assert all(texts), texts
    assert not [t for t in texts if "\ufffd" in t], texts
