"""The one exception root of streamchaos and its few meaningful branches.

    ChaosError
    ├── ExperimentInvalid        the experiment file (or a CLI argument) is wrong; nothing was touched
    ├── TargetNotAllowed         safety.allowed_targets does not allow what the run would act on; nothing was touched
    ├── SetupFailed              the stack, proxy or scraper could not be brought up
    │   ├── TargetUnreachable    the system under test does not answer
    │   └── FleetSignalError     a fleet signal (Prometheus, Alertmanager, the lever's ConfigMap) could not be read
    ├── RunRefused               the fleet says not now (the lever is engaged, a stop condition holds); nothing touched
    ├── FaultError               a fault could not act or could not be undone
    │   ├── FaultUnsupported     this environment cannot run the fault (no NVML, no docker, ...)
    │   ├── FaultPermissionDenied the fault needs privileges this process lacks
    │   ├── FaultRefused         the system refused the fault's action (a disruption budget): nothing changed
    │   └── FaultRevertFailed    an inject succeeded but its revert did not (see the journal)
    ├── ReportWriteFailed        a finished run's report file could not be written (which file, why)
    ├── RollbackInProgress       another process is rolling the same run back (its pid)
    └── VerificationInconclusive the observations cannot decide a verdict

SLA verdicts are result objects, never exceptions: a failing SLA is an outcome, not an error.
Each class carries the CLI exit code its kind of failure maps to (docs/contracts.md, "Exit codes").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ChaosError",
    "ExperimentInvalid",
    "FaultError",
    "FaultPermissionDenied",
    "FaultRefused",
    "FaultRevertFailed",
    "FaultUnsupported",
    "FleetSignalError",
    "Problem",
    "ReportWriteFailed",
    "RollbackInProgress",
    "RunRefused",
    "SetupFailed",
    "TargetNotAllowed",
    "TargetUnreachable",
    "UsageError",
    "VerificationInconclusive",
]


class ChaosError(Exception):
    """Root of every error streamchaos raises on purpose."""

    exit_code: int = 4


@dataclass(frozen=True)
class Problem:
    """One mistake in an experiment: where it is, what was found, what would be right."""

    file: str
    line: int  # 1-based; 0 when the position is unknown
    column: int  # 1-based; 0 when the position is unknown
    path: str  # key path such as ``phases[1].faults[0].jitter``
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.column}"
        key = f" {self.path}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class ExperimentInvalid(ChaosError):
    """The experiment is wrong; every problem found is listed, in file order."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [Problem(file="<experiment>", line=0, column=0, path="", message=problems)]
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.column))
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(ChaosError):
    """A command was used wrongly (a run directory that is not fresh, runs that do not match); nothing was changed."""

    exit_code = 2


class TargetNotAllowed(ChaosError):
    """The run would act on a host, namespace or selector ``safety.allowed_targets`` does not allow.

    Raised before anything starts; exit 2 like other configuration mistakes, since nothing was touched.
    """

    exit_code = 2


class SetupFailed(ChaosError):
    """The run could not be carried out: stack, proxy or scraper failed to come up."""

    exit_code = 4


class TargetUnreachable(SetupFailed):
    """The system under test did not answer at the address given."""


class FleetSignalError(SetupFailed):
    """A fleet signal the run must watch (``safety.stop_when``, ``safety.lever``) could not be read, or its
    server rejected the query; the message names the source, the URL and what it answered.

    ``rejected``: the server answered and refused the query itself (a PromQL syntax error, a bad matcher):
    the experiment is wrong, not the fleet."""

    def __init__(self, message: str, *, rejected: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected


class RunRefused(ChaosError):
    """The run was not started: the fleet lever is engaged, or a ``safety.stop_when`` condition holds
    already. Nothing was touched; exit 4 (the run could not be carried out), the message says who and why."""

    exit_code = 4


class FaultError(ChaosError):
    """A fault could not be injected or reverted."""

    exit_code = 4


class FaultUnsupported(FaultError):
    """This environment cannot run the fault; the message names the cause and the alternatives."""


class FaultPermissionDenied(FaultError):
    """The fault needs privileges (root, CAP_SYS_ADMIN, an admin token) this process lacks."""


class FaultRefused(FaultError):
    """The system refused what the fault asked (an eviction a PodDisruptionBudget blocked): nothing was
    changed, so there is nothing to roll back; the run ends with exit 4, the phases before keep their verdicts."""


class FaultRevertFailed(FaultError):
    """A fault was injected but could not be undone; `streamchaos rollback RUN_DIR` retries it."""


class VerificationInconclusive(ChaosError):
    """The observations are not enough to decide a verdict."""

    exit_code = 3


class ReportWriteFailed(ChaosError):
    """A report file of a finished run could not be written; the message names each file and why.

    Exit 4: the run's record (report.json, junit.xml) is part of what was asked for."""

    exit_code = 4


class RollbackInProgress(ChaosError):
    """Another process holds the run's rollback lock; the message names its pid. Nothing was done.

    Exit 4 from ``streamchaos rollback`` (this one did not roll back); the watchdog stands down (0)."""

    exit_code = 4
    holder: str = "unknown"  # the pid of the rollback in progress, as its lock file names it
