"""The front door's run: an experiment run with its report files written (report.json, report.html,
junit.xml). ``chaos.run``/``chaos.run_async`` are these; the CLI and the pytest plugin build their
runs here too. It sits above the run and its output: the runner (``chaos.execution``) knows nothing
of report files, the report writer (``chaos.output``) nothing of the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos.execution.events import RunListener
from chaos.execution.result import Result
from chaos.execution.runner import Runner
from chaos.model.experiment import Experiment
from chaos.output.report import ReportWriter

__all__ = ["run", "run_async", "runner"]


def runner(experiment: Experiment, *, listeners: Sequence[RunListener] = (), **kwargs: Any) -> Runner:
    """A ``Runner`` whose run also writes the report files (after every other listener has heard each event)."""
    return Runner(experiment, listeners=[*listeners, ReportWriter()], **kwargs)


async def run_async(
    experiment: Experiment | str | Path, *, target_url: str | None = None, out_dir: str | Path | None = None,
    seed: int | None = None, listeners: Sequence[RunListener] = (), handle_signals: bool = True,
    api_key_env: str | None = None, otlp: bool = False,
) -> Result:
    """Run an experiment (an ``Experiment`` or a path to its YAML) and return the ``Result``.

    ``otlp``: export the run's streams as OpenTelemetry metrics and spans over OTLP/HTTP when it ends
    (``chaos.output.otel``, configured by ``OTEL_EXPORTER_OTLP_*``), each request sending a ``traceparent``."""
    if isinstance(experiment, (str, Path)):
        from chaos.experiment import load_experiment

        experiment = load_experiment(experiment)
    if seed is not None:
        experiment = replace(experiment, seed=seed)
    if otlp:
        from chaos.output.otel import OtlpExporter

        listeners = [*listeners, OtlpExporter()]  # exports on RunFinished; what it sent: the run dir's otlp.json
    return await runner(experiment, target_url=target_url, out_dir=out_dir, listeners=listeners,
                        handle_signals=handle_signals,
                        api_key_env=api_key_env, traceparent=otlp).run()


def run(experiment: Experiment | str | Path, **kwargs: Any) -> Result:
    """Synchronous twin of ``run_async``."""
    return asyncio.run(run_async(experiment, **kwargs))
