"""The host tests build synthetic observations with the verifier tests' builders."""

from __future__ import annotations

import pytest

from tests.sla.conftest import Synth


@pytest.fixture
def synth() -> type[Synth]:
    return Synth
