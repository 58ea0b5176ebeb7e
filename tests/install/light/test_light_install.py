"""`pip install -e .` of the clone (no extra) in a fresh virtualenv: no torch, yet a run against a remote
target works; the builtin target says in one line which extra to install (exit 4, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[3]


def test_the_light_core_drives_a_remote_stack_without_torch(tmp_path: Path) -> None:
    venv = tmp_path / "light"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # --no-compile: byte-compiling all of numpy and scipy was 14 s of the install's 35 s of CPU; what the
    # runs below import is compiled as they import it
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check",
                              "-e", str(ROOT)],
                             capture_output=True, text=True, timeout=480)
    assert install.returncode == 0, install.stdout + install.stderr
    for module in ("torch", "tokenizers", "safetensors", "starlette", "uvicorn"):
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=60)
        assert probe.returncode != 0, f"{module} is importable in the light install"
    streamchaos = str(venv / "bin" / "streamchaos")
    refused = subprocess.run([streamchaos, "run", str(ROOT / "experiments" / "smoke.yaml"),
                              "--out", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 4
    assert refused.stderr.count("\n") == 1 and "-e '.[engine]'" in refused.stderr \
        and "download.pytorch.org/whl/cpu" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    with StackProcess.start("--port", "0") as stack:  # the engine from this (full) environment
        done = subprocess.run([streamchaos, "run", str(ROOT / "experiments" / "smoke.yaml"),
                               "--target-url", stack.base_url,
                               "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["target"]["engine"]["profile"] == "builtin" and report["load"]["streams"] > 0
