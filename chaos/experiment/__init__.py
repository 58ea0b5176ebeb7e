"""The experiment format: YAML → typed, immutable ``Experiment``, and ``streamchaos validate``
(``validate_command``)."""

from __future__ import annotations

from typing import TextIO

from chaos.model.experiment import (
    PROMPT_CLASSES,
    Experiment,
    FrozenMap,
    LoadSpec,
    PhaseSpec,
    PromptSpec,
    ProxySpec,
    SafetySpec,
    SlaEntry,
    TargetSpec,
    WorkloadSpec,
)

from .loader import experiment_from_dict, load_experiment, parse_experiment, validate_file

__all__ = [
    "PROMPT_CLASSES",
    "Experiment",
    "FrozenMap",
    "LoadSpec",
    "PhaseSpec",
    "PromptSpec",
    "ProxySpec",
    "SafetySpec",
    "SlaEntry",
    "TargetSpec",
    "WorkloadSpec",
    "experiment_from_dict",
    "load_experiment",
    "parse_experiment",
    "validate_command",
    "validate_file",
]


def validate_command(paths: list[str], out: TextIO) -> int:
    """``streamchaos validate FILE...``: ``OK path`` per valid file, else one located problem a line.

    Returns 0 when every file is valid, 2 otherwise (the CLI's "invalid experiment" exit code).
    """
    if not paths:
        out.write("streamchaos validate: give at least one experiment file\n")
        return 2
    status = 0
    for path in paths:
        problems = validate_file(path)
        if not problems:
            out.write(f"OK {path}\n")
            continue
        status = 2
        out.writelines(f"{problem}\n" for problem in problems)
    return status
