"""The GitHub Action (action.yml, chaos.output.github): its structure, and its steps run as the runner
runs a composite action: each `run:` script in bash with the `${{ }}` expressions substituted, the
step's env, and GITHUB_OUTPUT / GITHUB_STEP_SUMMARY files; setup-python and pip are skipped (the
package is installed here). One real run of the builtin stack with a planted failing SLA; the
inconclusive policy and the exit-2 path from reports written here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.model.verdict import Verdict
from chaos.output.github import annotation_lines, final_exit, sla_lines, summary_markdown, workflow_command

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
BIN = Path(sys.executable).parent  # the venv's python and streamchaos, as setup-python and pip would leave them

pytestmark = pytest.mark.timeout(120)

# the failing entry is at line 19, the inconclusive one at line 25 (asserted below)
EXPERIMENT = """\
name: gha-probe
description: builtin tiny model, a planted failing SLA
seed: 5
target: {kind: builtin, model: tiny}
load:
  concurrency: 4
  max_tokens: 16
phases:
  - name: baseline
    duration: 1s
  - name: storm
    duration: 1s
    faults:
      - kind: client.disconnect
        name: hangups
        fraction: 50%
        after_tokens: [1, 4]
sla:
  - kind: ttft
    name: ttft-tight
    quantile: p50
    budget: 1ms
  - kind: errors
    budget: 0%
  - kind: ttft
    name: ttft-tail
    quantile: p99.9
    budget: 2s
safety: {max_duration: 60s, cleanup_window: 1s, scrape_interval: 200ms}
"""

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Ran:
    """What a run of the action left: per step id its exit code and stdout, the outputs, the summary."""

    codes: dict[str, int] = field(default_factory=dict)
    stdout: dict[str, str] = field(default_factory=dict)
    steps: dict[str, dict[str, str]] = field(default_factory=dict)  # steps.<id>.outputs
    outputs: dict[str, str] = field(default_factory=dict)  # the action's outputs
    summary: str = ""

    @property
    def code(self) -> int:
        """The action's exit code: its last step's (a failed step ends a composite action)."""
        return list(self.codes.values())[-1]


def read_outputs(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT's ``name=value`` lines and ``name<<DELIM`` blocks."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            out[name] = "\n".join(iter(lambda: next(lines), delim))
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def run_action(inputs: dict[str, str], workdir: Path, *, seeded: dict[str, dict[str, str]] | None = None,
               skip: tuple[str, ...] = ()) -> Ran:
    """Run action.yml's steps as the runner would, in ``workdir`` (the workspace). ``seeded``: outputs of
    steps skipped (``skip``: their ids); steps that `uses:` an action or pip install are skipped too."""
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    given = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()} | inputs
    ran = Ran(steps=dict(seeded or {}))
    temp = workdir / "_runner_temp"
    temp.mkdir(exist_ok=True)

    def value(expr: str) -> str:
        parts = expr.split(".")
        if parts[0] == "inputs" and len(parts) == 2:
            return given[parts[1]]
        if expr == "github.action_path":
            return str(ROOT)
        if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
            return ran.steps.get(parts[1], {}).get(parts[3], "")
        raise AssertionError(f"an expression this interpreter does not know: {expr}")

    def sub(text: str) -> str:
        return EXPR.sub(lambda m: value(m.group(1)), text)

    for n, step in enumerate(action["runs"]["steps"]):
        sid = step.get("id", f"__{n}")
        if "uses" in step or "pip install" in step.get("run", "") or sid in skip:
            continue
        files = {name: temp / f"{name}-{n}" for name in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.write_text("")
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RUNNER_TEMP": str(temp),
               "GITHUB_ACTION_PATH": str(ROOT), "GITHUB_WORKSPACE": str(workdir),
               **{name: str(path) for name, path in files.items()},
               **{name: sub(str(v)) for name, v in (step.get("env") or {}).items()}}
        script = temp / f"step-{n}.sh"
        script.write_text(sub(step["run"]))
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workdir,
                              env=env, capture_output=True, text=True, timeout=90, check=False)
        ran.codes[sid], ran.stdout[sid] = done.returncode, done.stdout
        ran.steps[sid] = read_outputs(files["GITHUB_OUTPUT"].read_text())
        ran.summary += files["GITHUB_STEP_SUMMARY"].read_text()
        if done.returncode != 0:
            break
    ran.outputs = {name: sub(spec["value"]) for name, spec in action["outputs"].items()}
    return ran


def test_action_yml_is_a_composite_action_with_documented_inputs() -> None:
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    assert action["name"] and action["description"]
    assert set(action["inputs"]) == {"experiment", "target-url", "api-key-env", "inconclusive", "out",
                                     "python-version", "version"}
    for name, spec in action["inputs"].items():
        assert spec.get("description"), name
        assert spec.get("required", False) == (name == "experiment"), name
    assert action["inputs"]["inconclusive"]["default"] == "fail"
    assert {"exit-code", "report", "status"} <= set(action["outputs"])
    assert all(spec.get("description") and spec.get("value") for spec in action["outputs"].values())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    assert steps[0]["uses"].startswith("actions/setup-python@")
    for step in steps:
        if "run" in step:
            assert step.get("shell") == "bash", step.get("name")
            # inputs reach the scripts through env, never spliced into the shell text
            assert "${{" not in step["run"], step.get("name")


@pytest.mark.slow  # a whole run
def test_a_real_run_summarises_and_annotates_through_the_action(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    ran = run_action({"experiment": "exp.yaml"}, tmp_path)
    print(ran.summary)
    print(ran.stdout["summary"])
    assert ran.codes == {"run": 0, "summary": 1}  # the run step keeps going; the summary's follows the run
    assert ran.code == 1
    assert ran.steps["run"]["exit-code"] == "1" and ran.steps["summary"]["status"] == "fail"
    assert ran.outputs["exit-code"] == "1" and ran.outputs["status"] == "fail"
    report = Path(ran.outputs["report"])
    assert report.is_file() and report.parent == Path(ran.outputs["dir"])
    assert report.parent.parent == tmp_path / "_runner_temp"  # `out` empty: a new directory under RUNNER_TEMP
    # the summary: headline, fault times, one row per verdict
    assert "## streamchaos: gha-probe: FAIL" in ran.summary
    assert "- **Status:** completed, exit code **1** (an SLA failed)" in ran.summary
    assert re.search(r"\| hangups \| client\.disconnect \| storm \| \d+\.\d\ds \| \d+\.\d\ds \|", ran.summary)
    assert "| SLA | Phase | Status | Figure | Budget | Unit |" in ran.summary
    assert re.search(r"^\| ttft-tight \| run \| FAIL \(not as expected\) \| p50 [\d.]+ms \| 1\.0ms \| s \|$",
                     ran.summary, re.M)
    assert re.search(r"^\| errors \| run \| PASS \| [\d.]+% \| 0\.00% \| fraction \|$", ran.summary, re.M)
    assert re.search(r"^\| ttft-tail \| run \| INCONCLUSIVE \| p99\.9 [\d.]+ms \| 2\.00s \| s \|$", ran.summary, re.M)
    # the annotations: the failed entry at its line, the inconclusive one as a warning at its own
    lines = ran.stdout["summary"].splitlines()
    errors = [line for line in lines if line.startswith("::error ")]
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert len(errors) == 1 and errors[0].startswith(
        "::error title=SLA ttft-tight [run] failed,file=exp.yaml,line=19::ttft-tight [run]: FAIL, p50 "), errors
    assert "against a budget of 1.0ms" in errors[0] and "does not contain the budget" in errors[0]
    assert len(warnings) == 1 and warnings[0].startswith(
        "::warning title=SLA ttft-tail [run] inconclusive,file=exp.yaml,line=25::"), warnings
    assert EXPERIMENT.splitlines()[18] == "  - kind: ttft" and EXPERIMENT.splitlines()[24] == "  - kind: ttft"


def inconclusive_report() -> dict[str, Any]:
    verdicts = [Verdict("errors", None, "pass", 0.0, 0.0, "fraction", 80),
                Verdict("ttft", "storm", "inconclusive", 0.2, 0.25, "s", 12,
                        {"quantile": 0.99, "reason": "12 samples cannot bound the p99; at least 459 are needed"})]
    return {"experiment": "gha-probe", "description": "", "status": "completed", "exit_code": 3, "error": None,
            "duration_s": 2.0, "load": {"streams": 80}, "halt": None,
            "faults": [{"name": "hangups", "kind": "client.disconnect", "phase": "storm", "injected_at": 1.25,
                        "reverted_at": 2.5, "errors": []}],
            "verdicts": [v.to_dict() for v in verdicts]}


@pytest.mark.parametrize(("policy", "code", "warned"), [("fail", 3, False), ("pass", 0, False), ("warn", 0, True)])
def test_an_inconclusive_run_follows_the_inconclusive_input(tmp_path: Path, policy: str, code: int,
                                                            warned: bool) -> None:
    (tmp_path / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(inconclusive_report()))
    ran = run_action({"experiment": "exp.yaml", "inconclusive": policy}, tmp_path, skip=("run",),
                     seeded={"run": {"exit-code": "3", "report": str(report), "dir": str(tmp_path)}})
    assert ran.codes == {"summary": code}
    assert ran.outputs["status"] == "inconclusive" and ran.outputs["exit-code"] == "3"
    out = ran.stdout["summary"]
    assert "::warning title=SLA ttft [storm] inconclusive,file=exp.yaml,line=" in out  # every policy names it
    assert "::error" not in out
    assert ("::warning title=streamchaos inconclusive" in out) == warned
    assert "| ttft | storm | INCONCLUSIVE | p99 200.0ms | 250.0ms | s |" in ran.summary
    assert "| hangups | client.disconnect | storm | 1.25s | 2.50s |" in ran.summary
    assert f"(inconclusive: {policy})" in ran.summary


def test_no_report_is_an_error_annotation_and_the_runs_own_code(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    ran = run_action({"experiment": "exp.yaml", "inconclusive": "pass"}, tmp_path, skip=("run",),
                     seeded={"run": {"exit-code": "2", "report": "", "dir": str(tmp_path / "none")}})
    assert ran.codes == {"summary": 2} and ran.outputs["status"] == "invalid"
    assert ran.stdout["summary"].startswith("::error title=streamchaos did not run,file=exp.yaml,line=18::"
                                            "streamchaos exited 2 (invalid experiment or usage)")
    assert "streamchaos exited **2** (invalid experiment or usage)" in ran.summary


def test_a_wrong_inconclusive_input_is_refused(tmp_path: Path) -> None:
    ran = run_action({"experiment": "exp.yaml", "inconclusive": "maybe"}, tmp_path, skip=("run",),
                     seeded={"run": {"exit-code": "0", "report": ""}})
    assert ran.codes == {"summary": 2} and "::error title=streamchaos action input::" in ran.stdout["summary"]


def test_sla_lines_by_name_and_kind() -> None:
    lines = sla_lines(EXPERIMENT)
    assert lines == {"": 18, "ttft-tight": 19, "errors": 23, "ttft-tail": 25}
    assert sla_lines("sla: [") == {} and sla_lines("name: x\n") == {}


def test_workflow_commands_are_escaped() -> None:
    assert workflow_command("error", "50%\nmore", title="a: b, c", file="d.yaml", line=None) == \
        "::error title=a%3A b%2C c,file=d.yaml::50%25%0Amore"
    assert workflow_command("warning", "m") == "::warning::m"


def test_final_exit_and_the_pure_renderers() -> None:
    assert [final_exit(c, "fail") for c in range(5)] == [0, 1, 2, 3, 4]
    assert [final_exit(c, "warn") for c in range(5)] == [0, 1, 2, 0, 4] == [final_exit(c, "pass") for c in range(5)]
    with pytest.raises(ValueError):
        final_exit(3, "maybe")
    report = inconclusive_report() | {"status": "halted", "exit_code": 4, "error": "halted: error rate | 50%"}
    assert annotation_lines(report, "e.yaml")[0] == \
        "::error title=streamchaos run halted,file=e.yaml::run halted: halted: error rate | 50%25"
    md = summary_markdown(report, "e.yaml")
    assert "- **Error:** halted: error rate \\| 50%" in md  # a pipe does not break the table's Markdown
    assert "## streamchaos: gha-probe: ERROR" in md
