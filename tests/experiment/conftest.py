"""Test-only fault and SLA kinds, registered for this package's tests and removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from experiment_kinds import SLO, HangupFault, LatencyFault

import faults  # noqa: F401  (registers the real fault kinds first, so ours cannot shadow them)
import sla  # noqa: F401
from faults.base import REGISTRY as FAULTS
from faults.base import Fault
from sla.base import REGISTRY as VERIFIERS

TEST_FAULTS: dict[str, type[Fault]] = {LatencyFault.kind: LatencyFault, HangupFault.kind: HangupFault}


@pytest.fixture(scope="module", autouse=True)
def registered_test_kinds() -> Iterator[None]:
    """Register the test kinds for each module; remove them (and only them) afterwards.

    Module scope, not package: this directory is no package, and a "package" fixture here would
    live until the end of the session and leak the test kinds into other directories' tests.
    """
    FAULTS.update(TEST_FAULTS)
    VERIFIERS[SLO.kind] = SLO
    try:
        yield
    finally:
        for kind in TEST_FAULTS:
            FAULTS.pop(kind, None)
        VERIFIERS.pop(SLO.kind, None)
