"""Shared pieces for the report tests: the synthetic run builder on the import path, the probes."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # `from synthetic import synthetic_run`
