"""The `streamchaos` command line: run, validate, list, verify, rollback, report, budgets, manifests, stack,
toxiproxy, shard.

Exit codes (DESIGN.md): 0 every SLA as expected, 1 an SLA failed, 2 invalid experiment or usage,
3 inconclusive, 4 the run could not be carried out. A user mistake never prints a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, ExperimentInvalid, UsageError

__all__ = ["main"]


def _cmd_run(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.live import LiveProgress
    from chaos.report import render_summary
    from chaos.runner import run

    experiment = load_experiment(args.experiment)
    if args.seed is not None:
        from dataclasses import replace

        experiment = replace(experiment, seed=args.seed)
    if args.dry_run:
        import asyncio

        from chaos.dryrun import dry_run

        account = asyncio.run(dry_run(experiment, target_url=args.target_url))
        print("\n".join(account.lines))
        return account.exit_code
    if not (args.target_url or experiment.target.url) and experiment.target.kind == "builtin":
        from chaos.targets import require_engine

        require_engine("the experiment's target (kind builtin)")  # before anything is created: one line, exit 4
    listeners: list[Any] = [] if args.quiet else [LiveProgress()]
    with contextlib.ExitStack() as stack:
        if args.metrics_port is not None or args.push_metrics:
            from chaos.exporter import PrometheusExporter

            exporter = stack.enter_context(PrometheusExporter(port=args.metrics_port, push_url=args.push_metrics))
            if exporter.url:
                print(f"metrics: {exporter.url} (for the life of the run)", file=sys.stderr)
            listeners.append(exporter)
        result = run(experiment, target_url=args.target_url, out_dir=args.out, listeners=listeners, api_key_env=args.api_key_env)
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
    from chaos.experiment import experiment_from_dict, load_experiment
    from chaos.experiment.loader import read_text_bounded
    from chaos.experiment.yamlpos import YamlSyntaxError, load_bounded

    base = load_experiment(experiment_file)  # validates the stored copy first (within the YAML budget)
    try:
        other = load_bounded(read_text_bounded(str(sla_file)))
        raw = load_bounded(read_text_bounded(str(experiment_file)))
    except YamlSyntaxError as exc:
        raise ExperimentInvalid(f"{sla_file}:{exc.mark.line}:{exc.mark.column}: cannot read it as YAML: {exc.message}") from None
    entries = other.get("sla") if isinstance(other, dict) else other
    if not isinstance(entries, list):
        raise ExperimentInvalid(f"{sla_file}: expected a list of SLA entries or a mapping with an `sla:` list")
    raw["sla"] = entries
    del base
    return experiment_from_dict(raw, source=str(sla_file))


def _cmd_verify(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.verify import replay

    run_dir = Path(args.run_dir)
    journal, stored = run_dir / "journal.jsonl", run_dir / "experiment.yaml"
    if not journal.is_file() or not stored.is_file():
        raise ChaosError(f"{run_dir} is not a finished run directory (needs journal.jsonl and experiment.yaml)")
    experiment = _load_sla_override(stored, Path(args.sla)) if args.sla else load_experiment(stored)
    result = replay(experiment, run_dir)
    from chaos.report import render_summary

    print(render_summary(result, report_name="verify.json"))
    return result.exit_code


def _cmd_rollback(args: argparse.Namespace) -> int:
    import os

    from chaos.rollback import rollback_run

    # a k8s.scale is restored on the cluster configuration names (never one the journal names)
    if args.kubeconfig:
        os.environ["STREAMCHAOS_KUBECONFIG"] = args.kubeconfig
    if args.kube_context:
        os.environ["STREAMCHAOS_KUBE_CONTEXT"] = args.kube_context
    done = rollback_run(args.run_dir, allowed_urls=[u for u in (args.target_url, args.toxiproxy_url) if u])
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


def _cmd_manifests(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.k8s.manifests import render_rbac

    experiment = load_experiment(args.experiment)
    sys.stdout.write(render_rbac(experiment, name=args.service_account, namespace=args.namespace, in_cluster=not args.outside))
    return 0


def _read_report(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "report.json"
    if not path.is_file():
        raise UsageError(f"{path} does not exist: run `streamchaos run` with --out {run_dir} first")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable report.json ({exc})") from None
    if not isinstance(report, dict) or "verdicts" not in report:
        raise UsageError(f"{path}: not a streamchaos report (no `verdicts`)")
    return report


def _write_page(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--html {path}: cannot write it ({exc.strerror})") from None
    print(f"page: {path}")


def _cmd_compare(args: argparse.Namespace) -> int:
    from chaos.reports.compare import compare_reports, compare_table, render_compare

    dir_a, dir_b = (Path(d) for d in args.compare)
    a, b = _read_report(dir_a), _read_report(dir_b)
    rows = compare_reports(a, b, alpha=args.alpha, min_change=args.min_change)
    label_a, label_b = f"A {dir_a.name}", f"B {dir_b.name}"
    if a.get("experiment") != b.get("experiment"):
        print(f"note: comparing different experiments ({a.get('experiment')} and {b.get('experiment')})")
    for line in compare_table(rows, label_a, label_b):
        print(line)
    flagged = [r for r in rows if r.flagged]
    print(f"{len(flagged)} flagged" if flagged else "nothing flagged")
    _write_page(Path(args.html) if args.html else dir_b / "compare.html", render_compare(a, b, rows, label_a, label_b))
    return 1 if flagged else 0


def _cmd_history(args: argparse.Namespace) -> int:
    from chaos.reports.history import history_lines, load_runs, regressions, render_history

    root = Path(args.history)
    runs = load_runs(root, args.experiment)
    transitions = regressions(runs, alpha=args.alpha, min_change=args.min_change)
    for line in history_lines(runs, transitions):
        print(line)
    _write_page(Path(args.html) if args.html else root / "history.html", render_history(runs, transitions))
    return 1 if transitions and any(r.flagged for r in transitions[-1].rows) else 0  # the latest run regressed


def _cmd_report(args: argparse.Namespace) -> int:
    from chaos.render import from_report, verdict_table

    if args.compare:
        return _cmd_compare(args)
    if args.history:
        return _cmd_history(args)
    if not args.run_dir:
        raise UsageError("report: give RUN_DIR, --compare RUN_A RUN_B or --history DIR")
    if args.as_ == "vllm-bench":
        return _cmd_vllm_bench(args)
    report = _read_report(args.run_dir)
    print(f"{report['experiment']}: {report['status']} (exit {report['exit_code']}), {report['load']['streams']} streams")
    for fault in report["faults"]:
        print(f"  fault {fault['name']} ({fault['kind']}): injected {fault['injected_at']}s, reverted {fault['reverted_at']}s")
    verdicts = from_report(report["verdicts"])
    for line in verdict_table(verdicts):
        print("  " + line)
    definitions: list[str] = []
    for v in verdicts:
        for line in ([v.evidence["definition"]] if "definition" in v.evidence else []) + list(v.evidence.get("definitions", [])):
            if line not in definitions:
                definitions.append(line)
    if definitions:
        print("definitions:")
        for line in definitions:
            print(f"  {line}")
    return int(report["exit_code"])


def _cmd_vllm_bench(args: argparse.Namespace) -> int:
    from chaos.observations import Observations
    from chaos.vllm_bench import render_vllm_bench, vllm_bench_figures

    run_dir = Path(args.run_dir)
    journal = run_dir / "journal.jsonl"
    if not journal.is_file():
        raise UsageError(f"{journal} does not exist: give a run directory written by `streamchaos run --out`")
    obs = Observations.load(journal)
    if args.phase is not None and obs.phase(args.phase) is None and not any(s.phase == args.phase for s in obs.streams):
        known = ", ".join(p.name for p in obs.phases) or "none"
        raise UsageError(f"{run_dir}: no phase {args.phase!r} in this run; phases: {known}")
    print(render_vllm_bench(vllm_bench_figures(obs, args.phase), obs.experiment))
    return 0


def _cmd_shard(args: argparse.Namespace) -> int:
    from chaos.load.shard import shard_main

    return shard_main(args)


def _fraction(text: str) -> float:
    """``10%`` or ``0.1`` (argparse turns the ValueError into a usage error, exit 2)."""
    from chaos.units import parse_fraction

    try:
        return parse_fraction(text)
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises is a usage error here
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    p.add_argument("--api-key-env", metavar="NAME", help="the environment variable holding the target's API key "
                   "(overrides target.api_key_env / api_key; the key is never written anywhere)")
    p.add_argument("--seed", type=int, help="override the experiment's seed")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, resolve the target (GET /v1/models only), say what each fault would change and how it "
                        "is undone; start, change and write nothing")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the run's QoS metrics on 127.0.0.1:PORT/metrics while it runs (0: any free port)")
    p.add_argument("--push-metrics", metavar="URL", help="push the run's QoS metrics to this Prometheus Pushgateway")
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
    p.add_argument("--target-url", help="the run's target (its admin API may be contacted); the journal alone is not trusted")
    p.add_argument("--toxiproxy-url", help="the run's Toxiproxy API (also TOXIPROXY_URL); the journal alone is not trusted")
    p.add_argument("--kubeconfig", help="the run's cluster, for k8s.scale (also STREAMCHAOS_KUBECONFIG, KUBECONFIG)")
    p.add_argument("--kube-context", help="the kubeconfig context of the run's cluster (also STREAMCHAOS_KUBE_CONTEXT)")
    p.set_defaults(fn=_cmd_rollback)
    p = sub.add_parser("manifests", help="`manifests rbac EXPERIMENT`: the ServiceAccount, Role and RoleBinding an experiment needs")
    p.add_argument("what", choices=["rbac"])
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--service-account", default="streamchaos", help="the name of the ServiceAccount, Role and RoleBinding")
    p.add_argument("--namespace", help="put them in this namespace (default: the target's, if the experiment names one)")
    p.add_argument("--outside", action="store_true",
                   help="the runner runs outside the cluster (access: auto means port-forward, not the Service)")
    p.set_defaults(fn=_cmd_manifests)
    p = sub.add_parser("report", help="print a finished run's report; compare two runs; a history page over many")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--as", dest="as_", choices=["verdicts", "vllm-bench"], default="verdicts",
                   help="verdicts (default), or the run's figures under vLLM bench serve's names")
    p.add_argument("--phase", help="with --as vllm-bench: only this phase's streams")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="each SLA's figure in both runs, the change, and whether it is significant; exit 1 when flagged")
    p.add_argument("--history", metavar="DIR", help="one page over the runs in DIR (one experiment): trends, streaks, regressions")
    p.add_argument("--experiment", help="with --history: the experiment to show when DIR holds several")
    p.add_argument("--html", metavar="FILE", help="where the page goes (default: RUN_B/compare.html, DIR/history.html)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance of Fisher's test on shares (default 0.05)")
    p.add_argument("--min-change", type=_fraction, default=0.10, metavar="FRACTION",
                   help="smallest relative change flagged as a regression (default 10%%)")
    p.set_defaults(fn=_cmd_report)
    p = sub.add_parser("budgets", help="propose SLA budgets from healthy runs of an experiment")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished runs of one experiment on a healthy stack")
    p.add_argument("--false-fail", default="1%", help="the largest chance a healthy run fails or is undecided (default 1%%)")
    p.add_argument("--write", metavar="EXPERIMENT.yaml", help="write the proposed budgets into this experiment file")
    p.set_defaults(fn=_cmd_budgets)
    p = sub.add_parser("shard", help="be one load shard of a run whose load.shards is above 1 (a pod of an Indexed Job)")
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT", help="where the run's coordinator listens (load.shard_listen)")
    p.add_argument("--index", type=int, help="this shard's index (default: JOB_COMPLETION_INDEX)")
    p.add_argument("--count", type=int, required=True, help="how many shards the run has (load.shards)")
    p.add_argument("--journal-dir", default=".", help="where journal.shard-K.jsonl goes (default: here)")
    p.add_argument("--target-url", help="send the load here instead of the URL the coordinator gives (e.g. an in-cluster Service)")
    p.add_argument("--token-file", help="file holding the run's shard token (default: STREAMCHAOS_SHARD_TOKEN)")
    p.add_argument("--api-key-file", help="file holding the target's API key (default: STREAMCHAOS_API_KEY)")
    p.add_argument("--connect-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="keep trying to reach the coordinator this long (default 300)")
    p.set_defaults(fn=_cmd_shard)
    sub.add_parser("stack", help="`stack serve ...`: the builtin streaming stack (see `stack serve --help`)")
    sub.add_parser("toxiproxy", help="`toxiproxy serve ...`: the embedded Toxiproxy server")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # `stack serve` and `toxiproxy serve` own their flags; hand the rest over untouched
        if argv[:2] == ["stack", "serve"]:
            from chaos.targets import require_engine

            if "-h" not in argv and "--help" not in argv:
                require_engine("streamchaos stack serve")
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
