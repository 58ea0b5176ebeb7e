"""The `streamchaos` command line: run, validate, list, verify, rollback, report, budgets, stack, toxiproxy.

Exit codes (DESIGN.md): 0 every SLA as expected, 1 an SLA failed, 2 invalid experiment or usage,
3 inconclusive, 4 the run could not be carried out. A user mistake never prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, ExperimentInvalid, UsageError

__all__ = ["main"]


def _cmd_run(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.report import render_summary
    from chaos.runner import run

    experiment = load_experiment(args.experiment)
    started = time.monotonic()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    result = run(experiment, target_url=args.target_url, out_dir=args.out, seed=args.seed, progress=progress)
    print(render_summary(result))
    return result.exit_code


def _cmd_validate(args: argparse.Namespace) -> int:
    from chaos.experiment import validate_command

    return validate_command(args.files, sys.stdout)


def _cmd_list(args: argparse.Namespace) -> int:
    from chaos.catalogue import render_catalogue

    print(render_catalogue(args.what))
    return 0


def _load_sla_override(experiment_file: Path, sla_file: Path) -> Any:
    """The stored experiment with its `sla:` section replaced by the one in ``sla_file``."""
    import yaml

    from chaos.experiment import experiment_from_dict, load_experiment

    base = load_experiment(experiment_file)  # validates the stored copy first
    try:
        other = yaml.safe_load(sla_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ExperimentInvalid(f"{sla_file}: cannot read it as YAML: {exc}") from None
    entries = other.get("sla") if isinstance(other, dict) else other
    if not isinstance(entries, list):
        raise ExperimentInvalid(f"{sla_file}: expected a list of SLA entries or a mapping with an `sla:` list")
    raw = yaml.safe_load(experiment_file.read_text(encoding="utf-8"))
    raw["sla"] = entries
    del base
    return experiment_from_dict(raw, source=str(sla_file))


def _cmd_verify(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.observations import Observations
    from chaos.report import render_summary, report_dict
    from chaos.runner import Result, exit_code_for
    from chaos.verify import judge_all

    run_dir = Path(args.run_dir)
    journal, stored = run_dir / "journal.jsonl", run_dir / "experiment.yaml"
    if not journal.is_file() or not stored.is_file():
        raise ChaosError(f"{run_dir} is not a finished run directory (needs journal.jsonl and experiment.yaml)")
    experiment = _load_sla_override(stored, Path(args.sla)) if args.sla else load_experiment(stored)
    obs = Observations.load(journal)
    lag = next((n.data for n in reversed(obs.notes) if n.topic == "client_lag"), {})
    verdicts = judge_all(experiment, obs, client_lag=lag)
    previous = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").is_file() else {}
    result = Result(
        experiment=experiment, verdicts=verdicts, observations=obs, out_dir=run_dir, status=previous.get("status", "completed"),
        exit_code=exit_code_for(verdicts), started=previous.get("start", obs.wall_t0), ended=previous.get("end", obs.wall_t0),
        client_lag=lag,
    )
    (run_dir / "verify.json").write_text(json.dumps(report_dict(result), indent=2, default=str), encoding="utf-8")
    print(render_summary(result).replace("report.json", "verify.json"))
    return result.exit_code


def _cmd_rollback(args: argparse.Namespace) -> int:
    from chaos.rollback import rollback_run

    done = rollback_run(args.run_dir)
    if not done:
        print(f"{args.run_dir}: nothing to roll back")
        return 0
    failed = 0
    for entry in done:
        if "error" in entry:
            failed += 1
            print(f"FAILED {entry['fault']} ({entry['kind']}): {entry['error']}")
        else:
            print(f"rolled back {entry['fault']} ({entry['kind']}): {json.dumps(entry.get('evidence', {}), default=str)}")
    return 4 if failed else 0


def _cmd_report(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.as_ == "vllm-bench":
        from chaos.observations import Observations
        from chaos.vllm_bench import render_vllm_bench, vllm_bench_figures

        journal = run_dir / "journal.jsonl"
        if not journal.is_file():
            raise ChaosError(f"{journal} does not exist: give a run directory written by `streamchaos run --out`")
        obs = Observations.load(journal)
        if args.phase is not None and obs.phase(args.phase) is None and not any(s.phase == args.phase for s in obs.streams):
            known = ", ".join(p.name for p in obs.phases) or "none"
            raise ChaosError(f"{run_dir}: no phase {args.phase!r} in this run; phases: {known}")
        print(render_vllm_bench(vllm_bench_figures(obs, args.phase), obs.experiment))
        return 0
    path = run_dir / "report.json"
    if not path.is_file():
        raise ChaosError(f"{path} does not exist: run `streamchaos run` with --out {args.run_dir} first")
    report = json.loads(path.read_text(encoding="utf-8"))
    print(f"{report['experiment']}: {report['status']} (exit {report['exit_code']}), {report['load']['streams']} streams")
    for fault in report["faults"]:
        print(f"  fault {fault['name']} ({fault['kind']}): injected {fault['injected_at']}s, reverted {fault['reverted_at']}s")
    definitions: list[str] = []
    for v in report["verdicts"]:
        evidence = v.get("evidence") or {}
        n_eff = evidence.get("n_eff")
        eff = f" n_eff={n_eff:g}" if isinstance(n_eff, (int, float)) and n_eff < v["samples"] else ""
        print(f"  {v['name'] or v['sla']:<16} {v['phase'] or 'run':<12} {v['status']:<13} figure={v['figure']} "
              f"budget={v['budget']} {v['unit']} n={v['samples']}{eff}")
        for line in ([evidence["definition"]] if "definition" in evidence else []) + list(evidence.get("definitions", [])):
            if line not in definitions:
                definitions.append(line)
    if definitions:
        print("definitions:")
        for line in definitions:
            print(f"  {line}")
    return int(report["exit_code"])


def _cmd_budgets(args: argparse.Namespace) -> int:
    from chaos.budgets import load_baselines, propose, render_proposals, write_budgets
    from chaos.units import UnitError, parse_fraction

    try:
        false_fail = parse_fraction(args.false_fail)
    except UnitError as exc:
        raise UsageError(f"--false-fail: {exc}") from None
    runs = load_baselines(args.run_dirs)
    proposals = propose(runs, false_fail)
    print(render_proposals(proposals, runs, false_fail), end="")
    if args.write:
        changed = write_budgets(args.write, proposals, runs)
        print(f"wrote {len(changed)} value(s) to {args.write}: " + ", ".join(changed) if changed else
              f"{args.write}: nothing to write")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamchaos", description="Chaos experiments for LLM token-streaming stacks.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("run", help="run an experiment and judge its SLAs")
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--target-url", help="run against this OpenAI-compatible server instead of the experiment's target")
    p.add_argument("--out", help="run directory (default: runs/<time>-<name>)")
    p.add_argument("--seed", type=int, help="override the experiment's seed")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(fn=_cmd_run)
    p = sub.add_parser("validate", help="check experiment files; exit 0 valid, 2 invalid")
    p.add_argument("files", nargs="+")
    p.set_defaults(fn=_cmd_validate)
    p = sub.add_parser("list", help="the fault and SLA catalogues")
    p.add_argument("what", nargs="?", default="all", choices=["faults", "slas", "all"])
    p.set_defaults(fn=_cmd_list)
    p = sub.add_parser("verify", help="re-judge a finished run offline")
    p.add_argument("run_dir")
    p.add_argument("--sla", help="YAML with another `sla:` list to judge against")
    p.set_defaults(fn=_cmd_verify)
    p = sub.add_parser("rollback", help="undo what a killed run left behind (idempotent)")
    p.add_argument("run_dir")
    p.set_defaults(fn=_cmd_rollback)
    p = sub.add_parser("report", help="print a finished run's report")
    p.add_argument("run_dir")
    p.add_argument("--as", dest="as_", choices=["verdicts", "vllm-bench"], default="verdicts",
                   help="verdicts (default), or the run's figures under vLLM bench serve's names")
    p.add_argument("--phase", help="with --as vllm-bench: only this phase's streams")
    p.set_defaults(fn=_cmd_report)
    p = sub.add_parser("budgets", help="propose SLA budgets from healthy runs of an experiment")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished runs of one experiment on a healthy stack")
    p.add_argument("--false-fail", default="1%", help="the largest chance a healthy run fails or is undecided (default 1%%)")
    p.add_argument("--write", metavar="EXPERIMENT.yaml", help="write the proposed budgets into this experiment file")
    p.set_defaults(fn=_cmd_budgets)
    sub.add_parser("stack", help="`stack serve ...`: the builtin streaming stack (see `stack serve --help`)")
    sub.add_parser("toxiproxy", help="`toxiproxy serve ...`: the embedded Toxiproxy server")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # `stack serve` and `toxiproxy serve` own their flags; hand the rest over untouched
        if argv[:2] == ["stack", "serve"]:
            from chaos.stack.serve import serve_main

            return serve_main(argv[2:])
        if argv[:2] == ["toxiproxy", "serve"]:
            from faults.toxiproxy_server import main as toxiproxy_main

            return toxiproxy_main(argv[2:])
        if argv[:1] in (["stack"], ["toxiproxy"]):
            print(f"usage: streamchaos {argv[0]} serve [--help]", file=sys.stderr)
            return 2
        args = _parser().parse_args(argv)
        return int(args.fn(args))
    except ExperimentInvalid as exc:
        for problem in exc.problems:
            print(str(problem), file=sys.stderr)
        return exc.exit_code
    except ChaosError as exc:
        print(f"streamchaos: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("streamchaos: interrupted", file=sys.stderr)
        return 4
    except SystemExit as exc:  # argparse: usage errors are exit 2 already
        return int(exc.code) if isinstance(exc.code, int) else 2


if __name__ == "__main__":
    sys.exit(main())
