"""The GitHub Action's view of a finished run (``action.yml`` at the repository root).

Pure functions of a report.json dict: the job summary's Markdown (the run's headline, its faults with
their inject and revert times, the verdict table) and one workflow-command annotation per verdict not
as expected (``::error`` for a failed one, ``::warning`` for an inconclusive one), pointing at the
line of its SLA entry in the experiment file. ``main`` is the action step's thin entry
(``python -m chaos.output.github``): it reads the files, writes ``$GITHUB_STEP_SUMMARY`` and
``$GITHUB_OUTPUT``, prints the annotations and returns the step's exit code, which follows the
action's ``inconclusive`` input (docs/github-action.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chaos.experiment.yamlpos import YamlSyntaxError, load_located
from chaos.model.verdict import Verdict
from chaos.output.render import budget_text, figure_text, verdict_label, verdict_status, verdict_why

__all__ = ["INCONCLUSIVE_POLICIES", "OUTCOMES", "annotation_lines", "final_exit", "main", "outcome", "sla_lines",
           "summary_markdown", "workflow_command"]

# the exit codes' words (docs/contracts.md#exit-codes): the action's `status` output
OUTCOMES = {0: "pass", 1: "fail", 2: "invalid", 3: "inconclusive", 4: "error"}
_MEANINGS = {0: "every SLA as expected", 1: "an SLA failed", 2: "invalid experiment or usage",
             3: "inconclusive", 4: "the run could not be carried out"}
INCONCLUSIVE_POLICIES = ("fail", "pass", "warn")  # what exit 3 makes of the step


def outcome(exit_code: int) -> str:
    """``pass``, ``fail``, ``invalid``, ``inconclusive`` or ``error``; ``exit N`` for a code outside the contract."""
    return OUTCOMES.get(exit_code, f"exit {exit_code}")


def final_exit(exit_code: int, policy: str) -> int:
    """The step's exit code: the run's, except an inconclusive run (3) under ``pass`` or ``warn``, which is 0."""
    if policy not in INCONCLUSIVE_POLICIES:
        raise ValueError(f"inconclusive must be one of {', '.join(INCONCLUSIVE_POLICIES)}, not {policy!r}")
    return 0 if exit_code == 3 and policy != "fail" else exit_code


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: str | int | None) -> str:
    """``::error title=...,file=...,line=N::message``, escaped as the runner reads it; None properties left out."""
    props = ",".join(f"{key}={_escape_property(str(value))}" for key, value in properties.items() if value is not None)
    return f"::{command}{' ' + props if props else ''}::{_escape_data(message)}"


def sla_lines(yaml_text: str) -> dict[str, int]:
    """The 1-based line of each ``sla:`` entry of an experiment's YAML, by the entry's name (its ``name``,
    else its ``kind``, as the verdicts name it); ``""`` is the line of the ``sla:`` key itself. Empty
    when the text cannot be read as YAML (the annotations then name the file without a line)."""
    try:
        located = load_located(yaml_text)
    except YamlSyntaxError:
        return {}
    data = located.data
    if not isinstance(data, dict) or not isinstance(data.get("sla"), list):
        return {}
    lines: dict[str, int] = {}
    if ("sla",) in located.keys:
        lines[""] = located.keys[("sla",)].line
    for i, entry in enumerate(data["sla"]):
        mark = located.values.get(("sla", i))
        if not isinstance(entry, dict) or mark is None:
            continue
        name = entry.get("name") or entry.get("kind")
        if isinstance(name, str):
            lines.setdefault(name, mark.line)
    return lines


def _verdicts(report: Mapping[str, Any]) -> list[Verdict]:
    out = []
    for body in report.get("verdicts") or []:
        try:
            out.append(Verdict.from_dict(body))
        except TypeError:  # a report from a version whose verdicts carry other keys: keep the ones we know
            known = {"sla", "phase", "status", "figure", "budget", "unit", "samples", "evidence", "expect", "name",
                     "when_unobservable"}
            out.append(Verdict.from_dict({k: v for k, v in body.items() if k in known}))
    return out


def _kind_of_miss(v: Verdict) -> str | None:
    """``error`` for a verdict that fails the run, ``warning`` for one that leaves it inconclusive, else None."""
    if v.ok:
        return None
    return "warning" if v.counts_as == "inconclusive" else "error"


def annotation_lines(report: Mapping[str, Any], experiment: str, lines: Mapping[str, int] | None = None,
                exit_code: int | None = None) -> list[str]:
    """One ``::error`` per verdict not as expected and one ``::warning`` per inconclusive verdict, at the
    line of its SLA entry in ``experiment`` (``lines``: ``sla_lines`` of that file); and an ``::error``
    for a run that did not complete (``error``, ``halt``), or for no report at all (``report`` empty)."""
    lines = lines or {}
    code = report.get("exit_code", exit_code) if exit_code is None else exit_code
    out = []
    if not report:
        out.append(workflow_command("error", f"streamchaos exited {code} ({_MEANINGS.get(code or 0, 'unknown')}) "
                                    "and wrote no report.json: the step's log says why",
                                    title="streamchaos did not run", file=experiment, line=lines.get("")))
        return out
    if report.get("status") not in (None, "completed"):
        why = report.get("error") or (report.get("halt") or {}).get("reason") or "see the run's report.html"
        out.append(workflow_command("error", f"run {report.get('status')}: {why}",
                                    title=f"streamchaos run {report.get('status')}", file=experiment))
    for v in _verdicts(report):
        kind = _kind_of_miss(v)
        if kind is None:
            continue
        word = "inconclusive" if kind == "warning" else "failed"
        message = (f"{verdict_label(v)}: {verdict_status(v)}, {figure_text(v)} against a budget of "
                   f"{budget_text(v)} (n={v.samples})")
        why = verdict_why(v)
        if why:
            message += f"; {why}"
        line = lines.get(v.name) or lines.get(v.sla) or lines.get("")
        out.append(workflow_command(kind, message, title=f"SLA {verdict_label(v)} {word}", file=experiment,
                                    line=line))
    return out


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.2f}s"


def summary_markdown(report: Mapping[str, Any], experiment: str, exit_code: int | None = None,
                     policy: str = "fail") -> str:
    """The job summary: a headline (the run's outcome and status, exit code, experiment), its faults
    with inject and revert times (seconds from the run's start), and the verdict table; for no report,
    what the exit code says. No emoji: statuses are words."""
    code = report.get("exit_code") if exit_code is None else exit_code
    code = code if isinstance(code, int) else 4
    word = outcome(code)
    step = final_exit(code, policy)
    treated = f"; treated as {'passing' if step == 0 else 'failing'} (inconclusive: {policy})" if code == 3 else ""
    name = report.get("experiment") or Path(experiment).stem
    out = [f"## streamchaos: {_cell(name)}: {word.upper()}", ""]
    if not report:
        out += [f"streamchaos exited **{code}** ({_MEANINGS.get(code, 'unknown')}){treated} and wrote no "
                f"report.json; the step's log says why.", "", f"- **Experiment:** `{experiment}`", ""]
        return "\n".join(out)
    out += [f"- **Status:** {report.get('status', '-')}, exit code **{code}** ({_MEANINGS.get(code, 'unknown')})"
            f"{treated}",
            f"- **Experiment:** `{experiment}`" + (f": {_cell(report['description'])}"
                                                   if report.get("description") else ""),
            f"- **Duration:** {_seconds(report.get('duration_s'))}, "
            f"{(report.get('load') or {}).get('streams', '-')} streams"]
    if report.get("error"):
        out.append(f"- **Error:** {_cell(report['error'])}")
    halt = report.get("halt")
    if isinstance(halt, dict) and halt:
        out.append(f"- **Halted:** {_cell(halt.get('reason') or json.dumps(halt, default=str))}")
    faults = report.get("faults") or []
    out.append("")
    if faults:
        out += ["| Fault | Kind | Phase | Injected at | Reverted at |", "| --- | --- | --- | --- | --- |"]
        for fault in faults:
            errors = "; ".join(str(e) for e in fault.get("errors") or [])
            out.append(f"| {_cell(fault.get('name', '-'))} | {_cell(fault.get('kind', '-'))} | "
                       f"{_cell(fault.get('phase') or '-')} | {_seconds(fault.get('injected_at'))} | "
                       f"{_seconds(fault.get('reverted_at'))}{' (' + _cell(errors) + ')' if errors else ''} |")
    else:
        out.append("No faults.")
    out.append("")
    verdicts = _verdicts(report)
    if not verdicts:
        out += ["No verdicts.", ""]
        return "\n".join(out)
    out += ["| SLA | Phase | Status | Figure | Budget | Unit |", "| --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        status = verdict_status(v) + ("" if v.ok else " (not as expected)" if _kind_of_miss(v) == "error" else "")
        out.append(f"| {_cell(v.name or v.sla)} | {_cell(v.phase or 'run')} | {_cell(status)} | "
                   f"{_cell(figure_text(v))} | {_cell(budget_text(v))} | {_cell(v.unit)} |")
    whys = [(v, verdict_why(v)) for v in verdicts if not v.ok]
    if any(why for _, why in whys):
        out.append("")
        out += [f"- **{_cell(verdict_label(v))}:** {_cell(why)}" for v, why in whys if why]
    out.append("")
    return "\n".join(out)


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The action's summary step: write the summary and the ``status`` output, print the annotations,
    return the step's exit code. Reads ``GITHUB_STEP_SUMMARY`` and ``GITHUB_OUTPUT`` from ``environ``."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m chaos.output.github")
    parser.add_argument("--report", required=True, help="the run's report.json (may be missing)")
    parser.add_argument("--exit-code", required=True, type=int, help="what `streamchaos run` exited with")
    parser.add_argument("--experiment", required=True, help="the experiment file, as the annotations name it")
    parser.add_argument("--inconclusive", default="fail", help="what exit 3 means: fail, pass or warn")
    args = parser.parse_args(argv)
    if args.inconclusive not in INCONCLUSIVE_POLICIES:
        print(workflow_command("error", f"inconclusive: {args.inconclusive!r} is not one of "
                                        f"{', '.join(INCONCLUSIVE_POLICIES)}", title="streamchaos action input"))
        return 2
    try:
        report = json.loads(Path(args.report).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = {}
    try:
        lines = sla_lines(Path(args.experiment).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        lines = {}
    code = args.exit_code
    _append(env.get("GITHUB_STEP_SUMMARY"), summary_markdown(report, args.experiment, code, args.inconclusive) + "\n")
    _append(env.get("GITHUB_OUTPUT"), f"status={outcome(code)}\n")
    for line in annotation_lines(report, args.experiment, lines, code):
        print(line)
    step = final_exit(code, args.inconclusive)
    if code == 3 and args.inconclusive == "warn":
        print(workflow_command("warning", "the run was inconclusive (exit 3); passing the step as inconclusive: "
                                          "warn asks", title="streamchaos inconclusive", file=args.experiment))
    sys.stdout.flush()
    return step


if __name__ == "__main__":
    sys.exit(main())
