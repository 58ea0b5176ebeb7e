"""llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``, 0.3.36) with the builtin tiny
model as GGUF, its bindings loading the llama.cpp that scripts/build_llama_server.sh builds.

Its default (``interrupt_requests=True``) cuts a running stream as soon as another request waits for
its one model lock: the stream ends after about one token with ``[DONE]`` and no finish_reason, HTTP
200 and no error. smoke catches it (``early_close`` fails) and passes against ``--interrupt_requests
False``; the shipped ``llama-cpp-python-interrupt`` experiment is that regression alone. Its
starlette-context middleware answers HTTP 400 to an ``X-Request-Id`` that is not a UUID, which the
load's UUID-shaped ids (``load.request_ids: uuid``, the default) get past and ``sequence`` ids do not.
It is detected by ``/v1/models``' ``owned_by "me"`` (profile ``llama-cpp-python``); it has no /metrics,
so ``kv_cleanup`` is unobservable (tolerated), and it ignores ``stream_options.include_usage``, which
the preflight names. TTFT and ITL are reported, not asserted.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from servers import EXPERIMENTS, Served, box_noise_only, run_cli

from chaos.model.observations import Observations

pytestmark = pytest.mark.timeout(300)

NO_INTERRUPT = ("--interrupt_requests", "False")


def _run(experiment: Path, served: Served, run: Path, *, again: bool = True) -> tuple[int, str, dict]:
    """The run; once more where only this box left verdicts undecided (``servers.box_noise_only``)."""
    out = run_cli("run", str(experiment), "--target-url", served.url + "/v1", "--out", str(run), "--quiet",
                  timeout=120)
    text = out.stdout + out.stderr
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    if again and out.returncode == 3 and box_noise_only(report):
        print(f"rerun: {experiment.name} was inconclusive because of this box:\n{text}")
        shutil.rmtree(run)
        return _run(experiment, served, run, again=False)
    return out.returncode, text, report


def _verdicts(report: dict) -> dict[str, dict]:
    return {f"{v['name']}@{v['phase'] or 'run'}": v for v in report["verdicts"]}


def _ttft_p50_ms(run: Path) -> float:
    obs = Observations.load(run / "journal.jsonl")
    return statistics.median(s.ttft_ns / 1e6 for s in obs.streams if s.ttft_ns is not None)


def _refused(served: Served) -> int:
    """The requests the server answered 400 (its access log)."""
    return served.log.read_text(errors="replace").count('HTTP/1.1" 400')


def test_smoke_catches_the_default_interrupting_streams(llama_cpp_python: Callable[..., Served],
                                                        tmp_path: Path) -> None:
    served = llama_cpp_python()
    code, text, report = _run(EXPERIMENTS / "smoke.yaml", served, tmp_path / "run")
    assert code == 1, text + served.log.read_text(errors="replace")[-2000:]
    print(text, f"TTFT p50 {_ttft_p50_ms(tmp_path / 'run'):.1f} ms")
    assert _refused(served) == 0, "the server refused requests: " + served.log.read_text(errors="replace")[-2000:]
    engine = report["target"]["engine"]
    assert engine["profile"] == "llama-cpp-python" and 'owned_by "me"' in engine["detected_by"], engine
    ignored = {f["field"] for f in engine["ignored_fields"]}
    assert "stream_options.include_usage" in ignored, engine
    verdicts = _verdicts(report)
    early = verdicts["early_close@run"]
    share = early["figure"]
    assert early["status"] == "fail" and share > 0.5, (
        f"early_close {early['status']} with {share:.1%} of {early['samples']} streams cut: the default "
        f"interrupt_requests cuts nearly every stream of a concurrent load", early["evidence"])
    assert set(early["evidence"]["by_reason"]) == {"no_finish_reason"}, early["evidence"]
    assert verdicts["errors@run"]["status"] == "pass", verdicts["errors@run"]  # HTTP 200 each, no 400
    kv = verdicts["kv_cleanup@run"]
    assert kv["status"] == "unobservable" and kv["ok"], kv


def test_smoke_passes_with_interrupt_requests_off(llama_cpp_python: Callable[..., Served], tmp_path: Path) -> None:
    served = llama_cpp_python(*NO_INTERRUPT)
    code, text, report = _run(EXPERIMENTS / "smoke.yaml", served, tmp_path / "run")
    print(text, f"TTFT p50 {_ttft_p50_ms(tmp_path / 'run'):.1f} ms")
    assert code == 0, text + served.log.read_text(errors="replace")[-2000:]
    for key, v in _verdicts(report).items():
        assert v["status"] == "pass" or (v["status"] == "unobservable" and v["ok"]), (key, v["figure"], v["evidence"])
    assert _verdicts(report)["early_close@run"]["figure"] == 0.0


def test_sequence_request_ids_are_refused_at_the_preflight(llama_cpp_python: Callable[..., Served],
                                                           tmp_path: Path) -> None:
    """``load.request_ids: sequence`` (the old ``0-0`` ids): its middleware answers HTTP 400 to each, and the
    run stops at the preflight, naming it, before any load: the UUID default is what gets through."""
    served = llama_cpp_python(*NO_INTERRUPT)
    raw = yaml.safe_load((EXPERIMENTS / "smoke.yaml").read_text())
    raw["load"]["request_ids"] = "sequence"
    experiment = tmp_path / "smoke-sequence.yaml"
    experiment.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = _refused(served)
    code, text, _ = _run(experiment, served, tmp_path / "run")
    assert code == 4, text
    assert "preflight" in text and "HTTP 400" in text, text
    assert _refused(served) > before


@pytest.mark.parametrize(("flags", "exit_code"), [((), 1), (NO_INTERRUPT, 0)], ids=["default", "no-interrupt"])
def test_the_interrupt_experiment_fails_the_default_and_passes_the_fix(llama_cpp_python: Callable[..., Served],
                                                                        tmp_path: Path, flags: tuple[str, ...],
                                                                        exit_code: int) -> None:
    served = llama_cpp_python(*flags)
    code, text, report = _run(EXPERIMENTS / "llama-cpp-python-interrupt.yaml", served, tmp_path / "run")
    print(text)
    assert code == exit_code, text + served.log.read_text(errors="replace")[-2000:]
    early = _verdicts(report)["early_close@run"]
    assert early["status"] == ("fail" if exit_code else "pass"), early["evidence"]
    assert _verdicts(report)["errors@run"]["status"] == "pass"
