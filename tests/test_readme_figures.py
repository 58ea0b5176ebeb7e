"""The documentation's statements about what the code prints and what the shipped experiments judge,
checked against the code and the experiment files: the `--out` default (README.md), the quantiles
and budgets the screenshot paragraph quotes (docs/reports.md), the shipped-experiments table, the
"N things changed" count and which experiments judge a p50 (docs/experiments.md), and where n_eff is
shown (docs/concepts.md). Measured figures (times, rates) are not here: they change with the machine;
`scripts/screenshot_report.py` prints the screenshot's."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import chaos
from chaos.cli import _parser
from chaos.execution.runner import default_out_dir
from chaos.output.render import verdict_line, verdict_table
from chaos.output.reports.verdicts import samples_text as html_samples_text
from sla.base import Verdict

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
REPORTS = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
EXPERIMENTS = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
CONCEPTS = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())  # sentences wrap across lines; compare them with single spaces

NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _section(text: str, heading: str) -> str:
    start = text.index(heading) + len(heading)
    nxt = re.search(r"^#{1,3} ", text[start:], re.M)
    return text[start:start + nxt.start()] if nxt else text[start:]


def _ttft_quantiles(name: str) -> dict[str | None, tuple[float, float]]:
    """Per TTFT entry name: (quantile, budget in seconds) as the experiment file says."""
    experiment = chaos.load_experiment(ROOT / "experiments" / f"{name}.yaml")
    return {e.name: (e.params["quantile"], e.params["budget"]) for e in experiment.sla if e.kind == "ttft"}


def test_the_out_default_is_one_pattern_in_the_readme_the_help_and_the_code() -> None:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = next(a for a in sub.choices["run"]._actions if "--out" in a.option_strings)
    found = re.search(r"default: (\S+)\)", out.help or "")
    assert found, out.help
    pattern = found.group(1)
    assert f"`{pattern}/`" in README, f"the README does not name --out's default {pattern}"
    regex = re.escape(pattern).replace(re.escape("<time>"), r"\d{8}T\d{6}Z").replace(
        re.escape("<name>"), "network-jitter").replace(re.escape("<pid>"), str(os.getpid()))
    made = default_out_dir("network-jitter").as_posix()
    assert re.fullmatch(regex, made), f"--out's help says {pattern}, the runner makes {made}"


def test_the_screenshot_paragraph_quotes_what_network_jitter_judges() -> None:
    assert (ROOT / "docs" / "report-screenshot.png").is_file()
    assert "![report.html of experiments/network-jitter.yaml](report-screenshot.png)" in REPORTS
    flat = _flat(REPORTS)
    paragraph = flat[flat.index("In the screenshot"):flat.index("The timeline puts")]
    judged = _ttft_quantiles("network-jitter")
    q_jitter, budget_jitter = judged["ttft_under_jitter"]
    q_base, budget_base = judged["ttft"]
    said = re.search(r"jitter phase's TTFT p(\d+) .* its (\d+) ms budget; baseline and recovery .* pass their (\d+) ms",
                     paragraph)
    assert said, paragraph
    assert int(said.group(1)) == round(q_jitter * 100), f"the jitter phase judges p{q_jitter * 100:g}: {paragraph}"
    assert int(said.group(2)) == round(budget_jitter * 1000), f"its budget is {budget_jitter * 1000:g} ms: {paragraph}"
    assert int(said.group(3)) == round(budget_base * 1000), (f"baseline's budget is {budget_base * 1000:g} ms: "
                                                             f"{paragraph}")
    assert q_base == q_jitter, "the paragraph compares the baseline's quantile with the jitter phase's: the same one"


def test_the_shipped_experiments_table_lists_exactly_the_shipped_files() -> None:
    table = _section(EXPERIMENTS, "## Shipped experiments")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))
    shipped = {p.stem for p in (ROOT / "experiments").glob("*.yaml")}
    assert listed == shipped, (f"missing from the table: {sorted(shipped - listed)}; "
                               f"no such file: {sorted(listed - shipped)}")


def test_what_changed_counts_its_own_bullets() -> None:
    section = _section(EXPERIMENTS, "### What changed in their verdicts")
    word = re.search(r"(\w+) things changed how they get there", section)
    assert word, section[:300]
    bullets = re.findall(r"^- \*\*", section, re.M)
    assert NUMBERS.get(word.group(1).lower()) == len(bullets), f"'{word.group(1)} things' but {len(bullets)} bullets"


def test_the_experiments_said_to_judge_a_p50_do() -> None:
    section = _flat(_section(EXPERIMENTS, "### What changed in their verdicts"))
    bullet = section[section.index("**p90 became p50** in"):section.index("(`smoke`: p75)")]
    names = re.findall(r"`([a-z0-9-]+)`", bullet)
    assert len(names) >= 8, bullet
    for name in names:
        quantiles = {q for q, _ in _ttft_quantiles(name).values()}
        assert quantiles == {0.5}, f"{name} judges TTFT at {sorted(quantiles)}, docs/experiments.md says p50"
    assert {q for q, _ in _ttft_quantiles("smoke").values()} == {0.75}, "docs/experiments.md says smoke's TTFT is a p75"


def test_the_docs_say_where_n_eff_is_shown() -> None:
    v = Verdict("ttft", "storm", "pass", 0.02, 0.05, "s", 40, {"quantile": 0.5, "n_eff": 12.0})
    terminal = "n_eff" in "\n".join(verdict_table([v]))
    one_line = "n_eff" in verdict_line(v, evidence=False)  # JUnit messages and pytest failures
    html = "n_eff" in html_samples_text(v.to_dict())
    flat = _flat(CONCEPTS)
    assert ("(the terminal table gives n only)" in flat) == (not terminal), "the terminal table's N column changed"
    assert ("the verdict table of `report.html`" in flat) == html
    assert ("one-line verdicts in JUnit and pytest failures give n and n_eff" in flat) == one_line
