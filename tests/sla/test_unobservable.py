"""`unobservable`: a verdict whose evidence cannot exist on the target (no /metrics, an engine without
metrics, a profile without the series) is neither a pass nor an undecided `inconclusive`; the entry's
`when_unobservable` says how it counts. Evidence that could exist but is missing (a 401, a 500, too
few 404s, a series missing from scrapes that worked) stays inconclusive."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import sla
from chaos.execution.result import exit_code_for
from chaos.execution.verify import judge_all
from chaos.experiment.loader import parse_experiment
from chaos.model.errors import ExperimentInvalid
from chaos.model.verdict import Verdict
from chaos.output.render import unobservable_lines, verdict_table
from chaos.output.reports.verdicts import render_verdicts
from sla.engine_series import ABSENT_AFTER, ABSENT_STATUSES

pytestmark = pytest.mark.timeout(30)

EVERY = 0.25
OPENAI = {"name": "openai", "title": "generic OpenAI-compatible server",
          "usage_series": ["vllm:kv_cache_usage_perc"], "running_series": ["vllm:num_requests_running"],
          "metrics": True, "metrics_hint": "", "gateway": False}


def scrape_error(synth: Any, status: int | None, failures: int, url: str = "http://t/metrics", **extra: Any) -> Any:
    """A scraper's note as chaos.targets.scraper writes it: at its N-th failure, with the 404s (or 501s) in a
    row so far (all of them here), and from ABSENT_AFTER of them on the slower period it asks at."""
    error = f"HTTP {status}" if status else "ConnectError: connection refused"
    in_a_row = failures if status in (404, 501) else 0
    data: dict[str, Any] = {"absent_in_a_row": in_a_row}
    if in_a_row >= 10:
        data["next_every_s"] = 5.0
    data.update(extra)
    return synth.note("scrape_error", 0.2, url=url, error=error, status=status, failures=failures, **data)


def observed(synth: Any, *errors: Any, metrics: list[Any] | None = None, profile: dict[str, Any] | None = None) -> Any:
    streams = [synth.stream(f"s{i}", sent=1 + i * 0.1) for i in range(5)]
    notes = [synth.note("engine_profile", 0.0, profile=profile or OPENAI, end={"finish_reason": True, "done": True}),
             *errors]
    return synth.obs(streams, metrics or [], notes=notes)


def test_the_rule_for_an_absent_endpoint_is_the_scrapers() -> None:
    from chaos.targets import scraper

    assert (scraper.ABSENT_AFTER, scraper.ABSENT_STATUSES) == (ABSENT_AFTER, ABSENT_STATUSES) == (10, (404, 501))


@pytest.mark.parametrize("verifier", ["kv_cleanup", "abort_propagation"])
@pytest.mark.parametrize("status", [404, 501])
def test_a_target_without_metrics_is_unobservable(synth: Any, verifier: str, status: int) -> None:
    verdict = sla.judge(observed(synth, scrape_error(synth, status, 10, next_every_s=5.0)), verifier, {})
    assert verdict.status == "unobservable"
    assert verdict.evidence["reason"].startswith(f"the target has no /metrics ({status} ×10 at http://t/metrics)")


@pytest.mark.parametrize("verifier", ["kv_cleanup", "abort_propagation"])
@pytest.mark.parametrize("engine", ["vllm", "builtin", "tgi"])
def test_an_engine_that_always_serves_metrics_answering_404_stays_inconclusive(synth: Any, verifier: str,
                                                                             engine: str) -> None:
    """vLLM behind a gateway that forwards only /v1, or a mistyped metrics_url: the metrics exist, the run
    did not reach them. A setup to fix, never a tolerated "not observable"."""
    from chaos.model.engines import PROFILES

    obs = observed(synth, scrape_error(synth, 404, 10), profile=PROFILES[engine].describe())
    verdict = sla.judge(obs, verifier, {})
    assert verdict.status == "inconclusive", verdict.evidence


@pytest.mark.parametrize("verifier", ["kv_cleanup", "abort_propagation"])
@pytest.mark.parametrize("errors", [
    pytest.param([(401, 10)], id="401"),
    pytest.param([(500, 10)], id="500"),
    pytest.param([(None, 10)], id="refused"),
    pytest.param([(404, 1)], id="too-few-404s"),
    pytest.param([(404, 1), (500, 10)], id="404-then-500"),
])
def test_a_target_with_metrics_whose_scrapes_fail_stays_inconclusive(
        synth: Any, verifier: str, errors: list[tuple[int | None, int]]) -> None:
    obs = observed(synth, *(scrape_error(synth, status, n) for status, n in errors))
    verdict = sla.judge(obs, verifier, {})
    assert verdict.status == "inconclusive", verdict.evidence


def test_a_series_missing_from_scrapes_that_worked_stays_inconclusive(synth: Any) -> None:
    running = synth.steps("vllm:num_requests_running", 0.0, 4.0, EVERY, lambda t: 0.0)
    verdict = sla.judge(observed(synth, metrics=running), "kv_cleanup", {})
    assert verdict.status == "inconclusive"
    assert "no KV usage series was scraped" in verdict.evidence["reason"]


def test_a_series_from_an_endpoint_the_target_lacks_is_unobservable(synth: Any) -> None:
    """llama.cpp with --metrics but --no-slots: /metrics works, /slots answers 501: the KV series it reads
    from /slots cannot exist; a /slots that fails otherwise (500) could come back: inconclusive."""
    profile = {**OPENAI, "name": "llamacpp", "title": "llama.cpp server", "usage_series": ["llamacpp_slots:processing"],
               "running_series": ["llamacpp:requests_processing", "llamacpp_slots:processing"]}
    running = synth.steps("llamacpp:requests_processing", 0.0, 4.0, EVERY, lambda t: 0.0)
    absent = scrape_error(synth, 501, 10, url="http://t/slots")
    verdict = sla.judge(observed(synth, absent, metrics=running, profile=profile), "kv_cleanup", {})
    assert verdict.status == "unobservable"
    assert verdict.evidence["reason"].startswith("the KV usage series (llamacpp_slots:processing) was never scraped")
    failing = scrape_error(synth, 500, 10, url="http://t/slots")
    assert sla.judge(observed(synth, failing, metrics=running, profile=profile), "kv_cleanup", {}).status == \
        "inconclusive"
    # the running series comes from /metrics: abort_propagation can judge it (here: no client fault)
    assert sla.judge(observed(synth, absent, metrics=running, profile=profile), "abort_propagation", {}).status == \
        "inconclusive"


def experiment(when: str | None = None, expect: str = "pass") -> str:
    extra = (f", when_unobservable: {when}" if when else "") + (f", expect: {expect}" if expect != "pass" else "")
    return ("name: x\nphases: [{name: a, duration: 1s}]\n"
            f"sla:\n  - {{kind: kv_cleanup{extra}}}\n  - {{kind: errors, budget: 0.5}}\n")


@pytest.mark.parametrize("when,expect,code,counted", [
    (None, "pass", 0, None),
    ("tolerate", "pass", 0, None),
    ("inconclusive", "pass", 3, "inconclusive"),
    ("fail", "pass", 1, "fail"),
    # an expected failure that could not be seen is not a caught defect: never tolerated
    (None, "fail", 3, "inconclusive"),
    ("fail", "fail", 1, "fail"),
])
def test_when_unobservable_decides_how_it_counts(synth: Any, when: str | None, expect: str, code: int,
                                                 counted: str | None) -> None:
    exp = parse_experiment(experiment(when, expect))
    verdicts = judge_all(exp, observed(synth, scrape_error(synth, 404, 10)))
    kv = verdicts[0]
    assert (kv.status, kv.when_unobservable, kv.counts_as) == ("unobservable", when or "tolerate", counted)
    assert verdicts[1].status == "pass"
    assert exit_code_for(verdicts) == code
    body = kv.to_dict()
    assert body["status"] == "unobservable" and body["when_unobservable"] == (when or "tolerate")
    assert Verdict.from_dict(body) == kv
    # the other verdicts still decide a tolerated one's run
    failed = Verdict("errors", None, "fail", 0.9, 0.5, "fraction", 10)
    assert exit_code_for([kv, failed]) == 1


def test_the_console_and_the_pages_say_not_observable_on_this_engine(synth: Any, tmp_path: Path) -> None:
    from chaos.output.report import _junit

    exp = parse_experiment(experiment().replace("kv_cleanup}", "kv_cleanup, phases: [a]}"))
    verdicts = judge_all(exp, observed(synth, scrape_error(synth, 404, 10)))
    lines = unobservable_lines(verdicts)
    assert lines == [f"not observable on this engine: kv_cleanup (a): {verdicts[0].evidence['reason']} [tolerated]"]
    table = "\n".join(verdict_table(verdicts))
    assert "UNOBSERVABLE (tolerated)" in table and "why: not observable on this engine: the target has no" in table
    page = render_verdicts([v.to_dict() for v in verdicts])
    assert 'class="badge unobservable"' in page and "tolerated" in page
    assert "not observable on this engine" in page

    class _Result:
        experiment = exp
        status = "completed"
        error = None

    result = _Result()
    result.verdicts = verdicts  # type: ignore[attr-defined]
    suite = _junit(result).getroot()  # type: ignore[arg-type]
    assert suite.get("failures") == "0"
    skipped = [c for c in suite if c.find("skipped") is not None]
    assert len(skipped) == 1 and "not observable on this engine" in ET.tostring(skipped[0], encoding="unicode")


def test_a_bad_when_unobservable_names_file_line_key_and_the_choices() -> None:
    text = "name: x\nphases: [{name: a, duration: 1s}]\nsla:\n  - kind: kv_cleanup\n    when_unobservable: ignore\n"
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment(text, "exp.yaml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.path) == ("exp.yaml", 5, "sla[0].when_unobservable")
    assert "expected tolerate, inconclusive or fail" in problem.message and "'ignore'" in problem.message
