"""The `streamchaos` command line: run, capacity, survival, validate, list, verify, rollback, report, budgets,
manifests, stack, toxiproxy, shard, lever.

Exit codes (docs/contracts.md): 0 every SLA as expected, 1 an SLA failed, 2 invalid experiment or usage,
3 inconclusive, 4 the run could not be carried out. A user mistake never prints a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from chaos.model.errors import ChaosError, ExperimentInvalid, UsageError

if TYPE_CHECKING:
    from chaos.model.observations import Observations
    from chaos.model.verdict import Verdict

__all__ = ["main"]


def _cmd_run(args: argparse.Namespace) -> int:
    from chaos.api import run
    from chaos.experiment import load_experiment
    from chaos.output.live import LiveProgress
    from chaos.output.report import render_summary

    experiment = load_experiment(args.experiment)
    if args.seed is not None:
        from dataclasses import replace

        experiment = replace(experiment, seed=args.seed)
    if args.dry_run:
        import asyncio

        from chaos.execution.dryrun import dry_run

        account = asyncio.run(dry_run(experiment, target_url=args.target_url))
        print("\n".join(account.lines))
        return account.exit_code
    if not (args.target_url or experiment.target.url) and experiment.target.kind == "builtin":
        from chaos.targets.base import require_engine

        require_engine("the experiment's target (kind builtin)")  # before anything is created: one line, exit 4
    listeners: list[Any] = [] if args.quiet else [LiveProgress()]
    with contextlib.ExitStack() as stack:
        if args.metrics_port is not None or args.push_metrics:
            from chaos.output.exporter import PrometheusExporter

            exporter = stack.enter_context(PrometheusExporter(port=args.metrics_port, push_url=args.push_metrics))
            if exporter.url:
                print(f"metrics: {exporter.url} (for the life of the run)", file=sys.stderr)
            listeners.append(exporter)
        if args.grafana:  # after the run's result is final: one line whatever Grafana does, the exit code kept
            from chaos.output.grafana import GrafanaAnnotator

            listeners.append(GrafanaAnnotator(args.grafana, token=_grafana_token(args),
                                              token_env=args.grafana_token_env, dashboard_uid=args.grafana_dashboard,
                                              panel_id=args.grafana_panel))
        result = run(experiment, target_url=args.target_url, out_dir=args.out, listeners=listeners,
                     api_key_env=args.api_key_env, otlp=args.otlp)
    print(render_summary(result))
    return result.exit_code


def _cmd_capacity(args: argparse.Namespace) -> int:
    import asyncio

    from chaos.capacity.report import write_capacity_report
    from chaos.capacity.run import as_dict, search_capacity, summary_lines
    from chaos.execution.runner import default_out_dir
    from chaos.experiment import load_experiment
    from chaos.model.units import parse_duration

    experiment = load_experiment(args.experiment)
    if args.seed is not None:
        from dataclasses import replace

        experiment = replace(experiment, seed=args.seed)
    try:
        budget = parse_duration(args.budget) if args.budget is not None else None
    except ValueError as exc:
        raise UsageError(f"--budget: {exc}") from None
    if not (args.target_url or experiment.target.url) and experiment.target.kind == "builtin":
        from chaos.targets.base import require_engine

        require_engine("the experiment's target (kind builtin)")
    out = Path(args.out) if args.out else default_out_dir(f"{experiment.name}-capacity")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    with contextlib.ExitStack() as stack:
        exporter = None
        if args.metrics_port is not None or args.push_metrics:
            from chaos.output.exporter import PrometheusExporter

            exporter = stack.enter_context(PrometheusExporter(port=args.metrics_port, push_url=args.push_metrics))
            if exporter.url:
                print(f"metrics: {exporter.url} (for the life of the search)", file=sys.stderr)
        progress = None if exporter is None else (lambda partial: exporter.capacity(as_dict(partial)))
        result = asyncio.run(search_capacity(experiment, out_dir=out, target_url=args.target_url,
                                             api_key_env=args.api_key_env, budget_s=budget, say=say,
                                             progress=progress))
        body = as_dict(result)
        if exporter is not None:
            exporter.capacity(body, final=True)
    write_capacity_report(body, out)
    print("\n".join([*summary_lines(result), f"probes: {body['probes']} ({body['runs']} runs) in {body['took_s']:.0f}s "
                     f"(budget {body['budget_s']:.0f}s); report: {out / 'capacity.html'}"]))
    return result.exit_code


def _cmd_survival(args: argparse.Namespace) -> int:
    import asyncio

    from chaos.execution.runner import default_out_dir
    from chaos.experiment import load_experiment
    from chaos.survival.run import SurvivalSettings, check_path, dimensions_of

    experiment = load_experiment(args.experiment)
    check_path(experiment)  # before anything starts: a path that cannot be measured is a usage error
    settings = SurvivalSettings(dimensions=dimensions_of(args.dimensions), max_s=args.max,
                                resolution_s=args.resolution, budget_s=args.budget, keepalive_s=args.keepalive)
    problems = settings.problems()
    if problems:
        raise UsageError("; ".join(problems))
    if not (args.target_url or experiment.target.url) and experiment.target.kind == "builtin":
        from chaos.targets.base import require_engine

        require_engine("the experiment's target (kind builtin)")
    out = Path(args.out) if args.out else default_out_dir(f"{experiment.name}-survival")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    body = asyncio.run(_survival(experiment, out, settings, args, say))
    from chaos.survival.run import summary_text

    print(summary_text(body, out))
    return int(body["exit_code"])


async def _survival(experiment: Any, out: Path, settings: Any, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    """The search and its report, written before an interrupt reaches the command line."""
    from chaos.survival.run import as_dict, search_survival, write_survival_report

    result = await search_survival(experiment, out_dir=out, settings=settings, target_url=args.target_url,
                                   api_key_env=args.api_key_env, say=say)
    body = as_dict(result)
    write_survival_report(body, out)
    return body


def _cmd_validate(args: argparse.Namespace) -> int:
    from chaos.experiment import validate_command

    return validate_command(args.files, sys.stdout)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.what == "integrations":
        from chaos.output.integrations import integrations_text

        print(integrations_text(), end="")
        return 0
    if args.what == "experiments":
        from chaos.execution.shipped import experiments_dir, render_experiments, shipped_experiments

        print(render_experiments(shipped_experiments(), experiments_dir()), end="")
        return 0
    from chaos.output.catalogue import render_catalogue

    print(render_catalogue(args.what))
    return 0


def _run_dir(raw: str, needs: tuple[str, ...] = ("journal.jsonl",)) -> Path:
    """A run directory given on the command line, with the files the command needs; else a usage
    error (exit 2), worded the same for `report`, `verify`, `rollback` and `budgets`."""
    run_dir = Path(raw)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory (give one `streamchaos run --out` wrote)")
    missing = [name for name in needs if not (run_dir / name).is_file()]
    if missing:
        raise UsageError(f"{run_dir} is not a finished run directory (no {', '.join(missing)}): give one "
                         "`streamchaos run --out` wrote")
    return run_dir


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
        raise ExperimentInvalid(f"{sla_file}:{exc.mark.line}:{exc.mark.column}: cannot read it as YAML: "
                                f"{exc.message}") from None
    entries = other.get("sla") if isinstance(other, dict) else other
    if not isinstance(entries, list):
        raise ExperimentInvalid(f"{sla_file}: expected a list of SLA entries or a mapping with an `sla:` list")
    raw["sla"] = entries
    del base
    return experiment_from_dict(raw, source=str(sla_file))


def _cmd_verify(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.output.replay import replay

    run_dir = _run_dir(args.run_dir, ("journal.jsonl", "experiment.yaml"))
    stored = run_dir / "experiment.yaml"
    experiment = _load_sla_override(stored, Path(args.sla)) if args.sla else load_experiment(stored)
    result = replay(experiment, run_dir)
    from chaos.output.report import render_summary

    print(render_summary(result, page_name="verify.html"))
    return result.exit_code


def _cmd_rollback(args: argparse.Namespace) -> int:
    import os

    from chaos.execution.rollback import rollback_run

    # a k8s.scale is restored on the cluster configuration names (never one the journal names)
    if args.kubeconfig:
        os.environ["STREAMCHAOS_KUBECONFIG"] = args.kubeconfig
    if args.kube_context:
        os.environ["STREAMCHAOS_KUBE_CONTEXT"] = args.kube_context
    _run_dir(args.run_dir)
    done = rollback_run(args.run_dir, allowed_urls=[u for u in (args.target_url, args.toxiproxy_url) if u],
                        wait_s=args.wait)
    if not done:
        print(f"{args.run_dir}: nothing to roll back")
        return 0
    failed = 0
    for entry in done:
        if "error" in entry:
            failed += 1
            print(f"FAILED {entry['fault']} ({entry['kind']}): {entry['error']}")
        elif "gone" in entry.get("evidence", {}):  # its server died with the run: nothing left, not a failure
            print(f"gone {entry['fault']} ({entry['kind']}): {entry['evidence']['gone']}")
        else:
            print(f"rolled back {entry['fault']} ({entry['kind']}): "
                  f"{json.dumps(entry.get('evidence', {}), default=str)}")
    return 4 if failed else 0


def _cmd_manifests(args: argparse.Namespace) -> int:
    from chaos.experiment import load_experiment
    from chaos.k8s.manifests import render_rbac

    experiment = load_experiment(args.experiment)
    sys.stdout.write(render_rbac(experiment, name=args.service_account, namespace=args.namespace,
                                 in_cluster=not args.outside))
    return 0


def _read_report(run_dir: str | Path) -> dict[str, Any]:
    from chaos.output.reports.history import read_report

    return read_report(_run_dir(str(run_dir), ("report.json",)) / "report.json")


def _write_page(path: Path, text: str) -> None:
    from chaos.host.runfiles import replace_file

    try:
        replace_file(path, text)  # a new 0600 file renamed over the old page: a planted link is replaced, not followed
    except OSError as exc:
        raise UsageError(f"--html {path}: cannot write it ({exc.strerror})") from None
    print(f"page: {path}")


def _cmd_compare(args: argparse.Namespace) -> int:
    from chaos.output.reports.compare import compare_reports, compare_table, render_compare, setup_differences

    dir_a, dir_b = (Path(d) for d in args.compare)
    if (dir_a / "capacity.json").is_file() and (dir_b / "capacity.json").is_file():
        return _compare_capacity(dir_a, dir_b)
    a, b = _read_report(dir_a), _read_report(dir_b)
    rows = compare_reports(a, b, alpha=args.alpha, min_change=args.min_change, min_delay=args.min_delay)
    label_a, label_b = f"A {dir_a.name}", f"B {dir_b.name}"
    if a.get("experiment") != b.get("experiment"):
        print(f"note: comparing different experiments ({a.get('experiment')} and {b.get('experiment')})")
    for difference in setup_differences(a, b):
        print(f"setup differs: {difference}")
    for line in compare_table(rows, label_a, label_b):
        print(line)
    flagged = [r for r in rows if r.flagged]
    print(f"{len(flagged)} flagged" if flagged else "nothing flagged")
    _write_page(Path(args.html) if args.html else dir_b / "compare.html", render_compare(a, b, rows, label_a, label_b))
    return 1 if flagged else 0


def _compare_capacity(dir_a: Path, dir_b: Path) -> int:
    """Two capacity searches: per case both intervals; exit 1 when one is decisively lower in B."""
    from chaos.capacity.compare import compare_capacity, compare_lines

    try:
        a, b = (json.loads((d / "capacity.json").read_text(encoding="utf-8")) for d in (dir_a, dir_b))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read capacity.json: {exc}") from None
    rows = compare_capacity(a, b)
    for line in compare_lines(rows, str(b.get("unit", "")), f"A {dir_a.name}", f"B {dir_b.name}"):
        print(line)
    flagged = [r for r in rows if r.flagged]
    print(f"{len(flagged)} flagged (capacity lower in B)" if flagged else "nothing flagged")
    return 1 if flagged else 0


def _cmd_history(args: argparse.Namespace) -> int:
    from chaos.output.reports.history import history_lines, latest_regressed, load_runs, regressions, render_history

    root = Path(args.history)
    left_out: list[Path] = []
    runs = load_runs(root, args.experiment, left_out=left_out)
    for path in left_out:
        print(f"left out {path}: it ended before any verdict (failed or stopped during setup)")
    transitions = regressions(runs, alpha=args.alpha, min_change=args.min_change, min_delay=args.min_delay)
    for line in history_lines(runs, transitions):
        print(line)
    _write_page(Path(args.html) if args.html else root / "history.html", render_history(runs, transitions))
    return 1 if latest_regressed(runs, transitions) else 0  # against the run before it on its target


def _cmd_report(args: argparse.Namespace) -> int:
    if args.compare:
        return _cmd_compare(args)
    if args.history:
        return _cmd_history(args)
    if not args.run_dir:
        raise UsageError("report: give RUN_DIR, --compare RUN_A RUN_B or --history DIR")
    if args.grafana:
        return _cmd_report_grafana(args)
    if args.otlp:
        return _cmd_report_otlp(args)
    if args.as_ == "vllm-bench":
        return _cmd_vllm_bench(args)
    if args.as_ in ("llm-d", "aiperf"):
        return _cmd_result_format(args)
    return _cmd_report_run(args)


def _cmd_report_otlp(args: argparse.Namespace) -> int:
    """``report RUN_DIR --otlp``: the run's metrics and spans over OTLP/HTTP again (chaos.output.otel)."""
    from chaos.output.otel import export_run_dir, require_otel

    require_otel("report --otlp")
    run_dir = _run_dir(args.run_dir, ("journal.jsonl", "report.json"))
    outcome = export_run_dir(run_dir)
    if not outcome.ok:
        return 4  # export_run_dir printed why
    print(f"exported {outcome.spans} spans and {outcome.points} metric points to {outcome.endpoints['traces']} "
          f"and {outcome.endpoints['metrics']}")
    return 0


def _cmd_report_run(args: argparse.Namespace) -> int:
    """One run's summary: its faults, its verdict table and the definitions the verdicts used."""
    from chaos.model.outcome import judged_nothing

    report = _read_report(args.run_dir)
    if report.get("error"):
        print(f"error: {report['error']}")
    if judged_nothing(report):
        _print_nothing_judged(report, Path(args.run_dir))
        return int(report["exit_code"])
    _print_run_summary(report)
    return int(report["exit_code"])


def _grafana_token(args: argparse.Namespace) -> str | None:
    """The Grafana token from ``--grafana-token-env NAME`` (registered as a secret: never printed or written)."""
    import os

    from chaos.host.redact import register_secret

    if not args.grafana_token_env:
        return None
    token = os.environ.get(args.grafana_token_env, "").strip()
    if not token:
        raise UsageError(f"--grafana-token-env {args.grafana_token_env}: that environment variable is not set or empty")
    register_secret(token)
    return token


def _cmd_report_grafana(args: argparse.Namespace) -> int:
    """Push a finished run's phase, fault and halt windows to Grafana as annotations (docs/grafana.md)."""
    from chaos.output.grafana import annotations, push_annotations

    token = _grafana_token(args)
    bodies = annotations(_read_report(args.run_dir), dashboard_uid=args.grafana_dashboard, panel_id=args.grafana_panel)
    if not bodies:
        print(f"grafana: nothing to annotate in {args.run_dir} (no phase began)")
        return 0
    ids = push_annotations(args.grafana, bodies, token=token, token_env=args.grafana_token_env)  # refused: exit 4
    print(f"grafana: {len(ids)} annotations pushed to {args.grafana}: ids {', '.join(map(str, ids))}")
    return 0


def _print_nothing_judged(report: dict[str, Any], run_dir: Path) -> None:
    """A run that ended before any verdict: how it ended, what to check, where its page is."""
    from chaos.model.outcome import ended, next_steps

    print(f"{report['experiment']}: the run {ended(report.get('status'))} before any verdict: nothing was judged "
          f"(exit {report['exit_code']})")
    for step in next_steps(report.get("error"), str(report.get("status"))):
        print(f"  check: {step}")
    print(f"open: {run_dir / 'report.html'}")


def _print_run_summary(report: dict[str, Any]) -> None:
    from chaos.output.render import from_report, verdict_table

    print(f"{report['experiment']}: {report['status']} (exit {report['exit_code']}), "
          f"{report['load']['streams']} streams")
    for fault in report["faults"]:
        print(f"  fault {fault['name']} ({fault['kind']}): injected {fault['injected_at']}s, "
              f"reverted {fault['reverted_at']}s")
    verdicts = from_report(report["verdicts"])
    for line in verdict_table(verdicts, width=shutil.get_terminal_size((100, 24)).columns - 2):
        print("  " + line)
    definitions = _definitions(verdicts)
    if definitions:
        print("definitions:")
        for line in definitions:
            print(f"  {line}")


def _definitions(verdicts: list[Verdict]) -> list[str]:
    """The verdicts' metric definitions, each once, in the order they first appear."""
    definitions: list[str] = []
    for v in verdicts:
        own = [v.evidence["definition"]] if "definition" in v.evidence else []
        for line in own + list(v.evidence.get("definitions", [])):
            if line not in definitions:
                definitions.append(line)
    return definitions


def _run_observations(args: argparse.Namespace) -> tuple[Path, Observations]:
    """RUN_DIR's journal, with ``--phase`` checked against the run's phases."""
    from chaos.model.observations import Observations

    run_dir = _run_dir(args.run_dir)
    obs = Observations.load(run_dir / "journal.jsonl")
    if args.phase is not None and obs.phase(args.phase) is None and not any(s.phase == args.phase for s in obs.streams):
        known = ", ".join(p.name for p in obs.phases) or "none"
        raise UsageError(f"{run_dir}: no phase {args.phase!r} in this run; phases: {known}")
    return run_dir, obs


def _cmd_vllm_bench(args: argparse.Namespace) -> int:
    from chaos.output.vllm_bench import render_vllm_bench, vllm_bench_figures

    _, obs = _run_observations(args)
    print(render_vllm_bench(vllm_bench_figures(obs, args.phase), obs.experiment))
    return 0


def _cmd_result_format(args: argparse.Namespace) -> int:
    """``--as llm-d`` (one Benchmark Report per phase) or ``--as aiperf`` (profile_export_aiperf.json), as JSON."""
    from chaos.experiment import load_experiment
    from chaos.model.observations import iter_journal
    from chaos.output.aiperf_export import aiperf_export
    from chaos.output.llmd_report import llmd_report, llmd_reports

    run_dir, obs = _run_observations(args)
    records = [b for b in iter_journal(run_dir / "journal.jsonl") if b.get("type") in ("run", "end")]
    header = next((b for b in records if b.get("type") == "run"), {})
    end = next((b for b in records if b.get("type") == "end"), None)
    run_id = str(header.get("run_id", ""))
    out: Any
    if args.as_ == "aiperf":  # did not end as planned (halted, interrupted, failed, never closed): was_cancelled
        cancelled = end is None or end.get("status") != "completed"
        out = aiperf_export(obs, args.phase, run_id, cancelled=cancelled)
    else:
        load = load_experiment(run_dir / "experiment.yaml").load if (run_dir / "experiment.yaml").is_file() else None
        out = llmd_report(obs, args.phase, load, run_id) if args.phase else llmd_reports(obs, load, run_id)
    print(json.dumps(out, indent=2))
    return 0


def _cmd_shard(args: argparse.Namespace) -> int:
    from chaos.load.shard_process import shard_main

    return shard_main(args)


def _duration(text: str) -> float:
    """``10ms`` or ``0.5s`` in seconds (a usage error, exit 2, otherwise)."""
    from chaos.model.units import parse_duration

    try:
        return parse_duration(text)
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises is a usage error here
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(text: str) -> float:
    """``10%`` or ``0.1`` (argparse turns the ValueError into a usage error, exit 2)."""
    from chaos.model.units import parse_fraction

    try:
        return parse_fraction(text)
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises is a usage error here
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_budgets(args: argparse.Namespace) -> int:
    from chaos.execution.budgets import load_baselines, propose, render_proposals, write_budgets
    from chaos.model.units import UnitError, parse_fraction

    try:
        false_fail = parse_fraction(args.false_fail)
    except UnitError as exc:
        raise UsageError(f"--false-fail: {exc}") from None
    try:
        headroom = parse_fraction(args.headroom)
    except UnitError as exc:
        raise UsageError(f"--headroom: {exc}") from None
    left_out: list[Path] = []
    runs = load_baselines(args.run_dirs, left_out=left_out)
    for path in left_out:
        print(f"left out {path}: it ended before any verdict (failed or stopped during setup), so it says nothing "
              "about a healthy run")
    proposals = propose(runs, false_fail, headroom)
    print(render_proposals(proposals, runs, false_fail, headroom), end="")
    if args.write:
        changed = write_budgets(args.write, proposals, runs)
        print(f"wrote {len(changed)} value(s) to {args.write}: " + ", ".join(changed) if changed else
              f"{args.write}: nothing to write")
    return 0


def _cmd_lever(args: argparse.Namespace) -> int:
    import asyncio

    from chaos.fleet import lever
    from chaos.model.context import LeverSpec

    spec = LeverSpec(file=args.file, namespace=args.namespace, configmap=args.configmap, kubeconfig=args.kubeconfig,
                     context=args.context)
    if args.action == "status":
        states = asyncio.run(lever.read_levers(spec))
        for state in states:
            print(state.describe())
        return 1 if any(s.engaged for s in states) else 0
    # on/off act on the file, or on the ConfigMap alone when --namespace is given without --file
    on_file, on_configmap = bool(args.file or not args.namespace), bool(args.namespace)
    if args.action == "on":
        if on_file:
            print("engaged: " + lever.engage_file(lever.lever_file(spec), args.reason, args.by).describe())
        if on_configmap:
            print("engaged: " + asyncio.run(lever.engage_configmap(spec, args.reason, args.by)).describe())
        return 0
    befores = [lever.release_file(lever.lever_file(spec))] if on_file else []
    if on_configmap:
        befores.append(asyncio.run(lever.release_configmap(spec, args.reason, args.by)))
    for before in befores:
        print(f"released the fleet lever ({before.where})" if before.engaged
              else f"the fleet lever ({before.where}) was not engaged: nothing to release")
    return 0


def _version() -> str:
    """The installed distribution's version; the source tree's own when it is run uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streamchaos")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]) + " (not installed)"
        except (OSError, KeyError, ValueError):
            return "unknown (not installed)"


# the subcommands of the parser (argparse names no public type; its class is generic in the stubs only, so a string)
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamchaos",
                                     description="Chaos experiments for LLM token-streaming stacks.")
    parser.add_argument("--version", action="version", version=f"streamchaos {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_capacity(sub)
    _add_survival(sub)
    _add_validate(sub)
    _add_list(sub)
    _add_verify(sub)
    _add_rollback(sub)
    _add_manifests(sub)
    _add_report(sub)
    _add_budgets(sub)
    _add_shard(sub)
    _add_lever(sub)
    sub.add_parser("stack", help="`stack serve ...`: the builtin streaming stack (see `stack serve --help`)")
    sub.add_parser("toxiproxy", help="`toxiproxy serve ...`: the embedded Toxiproxy server")
    return parser


def _add_run(sub: Commands) -> None:
    p = sub.add_parser("run", help="run an experiment and judge its SLAs")
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--target-url", help="run against this OpenAI-compatible server instead of the experiment's target")
    p.add_argument("--out", help="run directory (default: runs/<time>-<name>-<pid>)")
    p.add_argument("--api-key-env", metavar="NAME", help="the environment variable holding the target's API key "
                   "(overrides target.api_key_env / api_key; the key is never written anywhere)")
    p.add_argument("--seed", type=int, help="override the experiment's seed")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, resolve the target (GET /v1/models, then the load's request once), check the engine "
                        "extra a builtin target needs, say what each fault would change and how it is undone; start, "
                        "change and write nothing")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the run's QoS metrics on 127.0.0.1:PORT/metrics while it runs (0: any free port)")
    p.add_argument("--push-metrics", metavar="URL", help="push the run's QoS metrics to this Prometheus Pushgateway")
    p.add_argument("--otlp", action="store_true",
                   help="export the run's streams as OpenTelemetry metrics and spans over OTLP/HTTP when it ends, "
                        "configured by OTEL_EXPORTER_OTLP_*; sends traceparent to the target (docs/opentelemetry.md)")
    _add_grafana(p, "when the run finishes, push its phase and fault windows to this Grafana as annotations "
                 "(Grafana down or refusing: one line, the exit code unchanged)")
    p.set_defaults(fn=_cmd_run)


def _add_capacity(sub: Commands) -> None:
    p = sub.add_parser("capacity", help="the highest load meeting every SLA, in the baseline and with each fault")
    p.add_argument("experiment", help="experiment YAML file with a capacity section")
    p.add_argument("--target-url", help="search this OpenAI-compatible server instead of the experiment's target")
    p.add_argument("--out", help="directory for capacity.json, capacity.html and every probe's run "
                   "(default: runs/<time>-<name>-capacity-<pid>)")
    p.add_argument("--budget", help="the whole search's time, e.g. 10m (default: capacity.budget)")
    p.add_argument("--seed", type=int, help="override the experiment's seed (every probe runs with it)")
    p.add_argument("--api-key-env", metavar="NAME", help="the environment variable holding the target's API key")
    p.add_argument("--quiet", action="store_true", help="no line per probe")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve each case's capacity so far on 127.0.0.1:PORT/metrics for the life of the search")
    p.add_argument("--push-metrics", metavar="URL",
                   help="push each case's capacity to this Pushgateway after every probe")
    p.set_defaults(fn=_cmd_capacity)


def _add_survival(sub: Commands) -> None:
    p = sub.add_parser("survival", help="the stream-survival matrix of the experiment's path: the longest hold, "
                       "silence and total duration that arrive whole, and the hop that cuts")
    p.add_argument("experiment", help="experiment YAML file whose path: ends with a stream hop")
    p.add_argument("--dimensions", default="all", metavar="LIST",
                   help="comma-separated, of hold, hold_keepalive, silence, silence_keepalive, deadline (default: all)")
    p.add_argument("--max", type=_duration, default=120.0, metavar="DURATION",
                   help="the longest duration probed, e.g. 2m (default 120s): surviving it reads 'survives >= max'")
    p.add_argument("--resolution", type=_duration, default=1.0, metavar="DURATION",
                   help="how narrow each boundary is searched (default 1s)")
    p.add_argument("--budget", type=_duration, default=600.0, metavar="DURATION",
                   help="the whole search's wall time, start-up included (default 10m); what is known when it runs "
                        "out is reported, with the dimensions not finished")
    p.add_argument("--keepalive", type=_duration, default=2.0, metavar="DURATION",
                   help="the interval of ': keep-alive' comments in the *_keepalive dimensions (default 2s)")
    p.add_argument("--out", help="directory for survival.json, report.html and the journal "
                   "(default: runs/<time>-<name>-survival-<pid>)")
    p.add_argument("--target-url", help="probe through the path to this OpenAI-compatible server instead of the "
                   "experiment's target")
    p.add_argument("--api-key-env", metavar="NAME", help="the environment variable holding the target's API key")
    p.add_argument("--quiet", action="store_true", help="no line per probe")
    p.set_defaults(fn=_cmd_survival)


def _add_validate(sub: Commands) -> None:
    p = sub.add_parser("validate", help="check experiment files; exit 0 valid, 2 invalid")
    p.add_argument("files", nargs="+")
    p.set_defaults(fn=_cmd_validate)


def _add_list(sub: Commands) -> None:
    p = sub.add_parser("list", help="the fault, SLA and target catalogues, or the shipped experiments")
    p.add_argument("what", nargs="?", default="all",
                   choices=["faults", "slas", "targets", "experiments", "integrations", "all"],
                   help="faults, slas, targets, all (the three; the default), experiments: the ones shipped in "
                        "experiments/, or integrations: the tools streamchaos plugs into")
    p.set_defaults(fn=_cmd_list)


def _add_verify(sub: Commands) -> None:
    p = sub.add_parser("verify", help="re-judge a finished run offline")
    p.add_argument("run_dir")
    p.add_argument("--sla", help="YAML with another `sla:` list to judge against")
    p.set_defaults(fn=_cmd_verify)


def _add_rollback(sub: Commands) -> None:
    p = sub.add_parser("rollback", help="undo what a killed run left behind (idempotent)")
    p.add_argument("run_dir")
    p.add_argument("--target-url",
                   help="the run's target (its admin API may be contacted); the journal alone is not trusted")
    p.add_argument("--toxiproxy-url",
                   help="the run's Toxiproxy API (also TOXIPROXY_URL); the journal alone is not trusted")
    p.add_argument("--kubeconfig", help="the run's cluster, for k8s.scale (also STREAMCHAOS_KUBECONFIG, KUBECONFIG)")
    p.add_argument("--kube-context", help="the kubeconfig context of the run's cluster (also STREAMCHAOS_KUBE_CONTEXT)")
    p.add_argument("--wait", type=_duration, default=60.0, metavar="DURATION",
                   help="how long to wait for a rollback of this run already in progress (a killed run's watchdog) "
                        "to end before refusing, exit 4 (default 60s; 0: refuse at once)")
    p.set_defaults(fn=_cmd_rollback)


def _add_manifests(sub: Commands) -> None:
    p = sub.add_parser("manifests",
                       help="`manifests rbac EXPERIMENT`: the ServiceAccount, Role and RoleBinding an experiment needs")
    p.add_argument("what", choices=["rbac"])
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--service-account", default="streamchaos",
                   help="the name of the ServiceAccount, Role and RoleBinding")
    p.add_argument("--namespace",
                   help="put them in this namespace (default: the target's, if the experiment names one)")
    p.add_argument("--outside", action="store_true",
                   help="the runner runs outside the cluster (access: auto means port-forward, not the Service)")
    p.set_defaults(fn=_cmd_manifests)


def _add_report(sub: Commands) -> None:
    p = sub.add_parser("report", help="print a finished run's report; compare two runs; a history page over many")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--as", dest="as_", choices=["verdicts", "vllm-bench", "llm-d", "aiperf"], default="verdicts",
                   help="verdicts (default); the run's figures under vLLM bench serve's names (vllm-bench); "
                        "llm-d Benchmark Reports v0.2.1, one per phase, as JSON (llm-d); AIPerf's "
                        "profile_export_aiperf.json (aiperf). See docs/result-formats.md")
    p.add_argument("--phase", help="with --as vllm-bench, llm-d or aiperf: only this phase's streams")
    p.add_argument("--otlp", action="store_true",
                   help="export RUN_DIR's streams again as OpenTelemetry metrics and spans over OTLP/HTTP "
                        "(OTEL_EXPORTER_OTLP_*), with the trace and span ids of the run; exit 4 when it fails")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="each SLA's figure in both runs, the change, and whether it is significant; exit 1 when "
                        "flagged")
    p.add_argument("--history", metavar="DIR",
                   help="one page over the runs in DIR (one experiment): trends, streaks, regressions")
    p.add_argument("--experiment", help="with --history: the experiment to show when DIR holds several")
    p.add_argument("--html", metavar="FILE", help="where the page goes (default: RUN_B/compare.html, DIR/history.html)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance of Fisher's test on shares (default 0.05)")
    p.add_argument("--min-change", type=_fraction, default=0.10, metavar="FRACTION",
                   help="smallest relative change flagged as a regression (default 10%%)")
    p.add_argument("--min-delay", type=_duration, default=0.010, metavar="DURATION",
                   help="smallest latency change flagged as a regression, e.g. 5ms (default 10ms): milliseconds of "
                        "host scheduling are not a regression")
    _add_grafana(p, "push RUN_DIR's phase and fault windows to this Grafana (its root URL) as annotations; "
                 "exit 4 when Grafana refuses (docs/grafana.md)")
    p.set_defaults(fn=_cmd_report)


def _add_grafana(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--grafana", metavar="URL", help=what)
    p.add_argument("--grafana-token-env", metavar="NAME",
                   help="the environment variable holding a Grafana service-account token (sent as a Bearer token, "
                        "never printed or written)")
    p.add_argument("--grafana-dashboard", metavar="UID", help="pin the annotations to this dashboard (its UID)")
    p.add_argument("--grafana-panel", type=int, metavar="ID", help="and to this panel of it")


def _add_budgets(sub: Commands) -> None:
    p = sub.add_parser("budgets", help="propose SLA budgets from healthy runs of an experiment")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished runs of one experiment on a healthy stack")
    p.add_argument("--false-fail", default="1%",
                   help="the largest chance a healthy run fails or is undecided (default 1%%)")
    p.add_argument("--headroom", default="0%",
                   help="room for a box unlike the runs' (a shared CI machine): latency budgets x (1 + it), rate "
                        "floors x (1 - it); e.g. 25%% (default 0%%)")
    p.add_argument("--write", metavar="EXPERIMENT.yaml", help="write the proposed budgets into this experiment file")
    p.set_defaults(fn=_cmd_budgets)


def _add_shard(sub: Commands) -> None:
    p = sub.add_parser("shard",
                       help="be one load shard of a run whose load.shards is above 1 (a pod of an Indexed Job)")
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                   help="where the run's coordinator listens (load.shard_listen)")
    p.add_argument("--index", type=int, help="this shard's index (default: JOB_COMPLETION_INDEX)")
    p.add_argument("--count", type=int, required=True, help="how many shards the run has (load.shards)")
    p.add_argument("--journal-dir", default=".", help="where journal.shard-K.jsonl goes (default: here)")
    p.add_argument("--target-url",
                   help="send the load here instead of the URL the coordinator gives (e.g. an in-cluster Service)")
    p.add_argument("--token-file", help="file holding the run's shard token (default: STREAMCHAOS_SHARD_TOKEN)")
    p.add_argument("--api-key-file", help="file holding the target's API key (default: STREAMCHAOS_API_KEY)")
    p.add_argument("--connect-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="keep trying to reach the coordinator this long (default 300)")
    p.set_defaults(fn=_cmd_shard)


def _add_lever(sub: Commands) -> None:
    p = sub.add_parser(
        "lever", help="the fleet lever: while engaged, runs refuse to start and running ones halt and revert",
        description="The fleet lever (docs/lever.md). `on` engages it: every run on this host (the file) or "
        "watching this namespace (the ConfigMap) refuses to start, and running ones halt and revert within about "
        "a second. `off` releases it; `status` prints each lever and exits 0 when none is engaged, 1 when one is. "
        "on/off write the file, or only the ConfigMap when --namespace is given without --file. Exit 4: a lever "
        "could not be read or written.")
    p.add_argument("action", choices=["on", "off", "status"])
    p.add_argument("--reason", help="why (shown to every run it stops)")
    p.add_argument("--by", help="who (default: user@host)")
    p.add_argument("--file", help="the lever file (default: $STREAMCHAOS_LEVER_FILE, else /var/lib/streamchaos/lever)")
    p.add_argument("--namespace", help="the Kubernetes namespace of the lever's ConfigMap")
    p.add_argument("--configmap", default="streamchaos-lever", help="the ConfigMap's name (default streamchaos-lever)")
    p.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: KUBECONFIG, ~/.kube/config, the pod's)")
    p.add_argument("--context", help="the kubeconfig context")
    p.set_defaults(fn=_cmd_lever)


def main(argv: list[str] | None = None) -> int:
    from chaos.host.redact import RedactingStream

    if list(sys.argv[1:] if argv is None else argv)[:2] in (["stack", "serve"], ["toxiproxy", "serve"]):
        return _main(argv)  # servers, not a run's record: their streams are their own
    # the console is a record too: no configured secret or URL userinfo reaches it (chaos.host.redact)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(stdout), RedactingStream(stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # `stack serve` and `toxiproxy serve` own their flags; hand the rest over untouched
        if argv[:2] == ["stack", "serve"]:
            from chaos.targets.base import require_engine

            if "-h" not in argv and "--help" not in argv:
                require_engine("streamchaos stack serve")
            from chaos.stack.serve import serve_main

            return serve_main(argv[2:])
        if argv[:2] == ["toxiproxy", "serve"]:
            from chaos.toxiproxy.server import main as toxiproxy_main

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
