"""The integrations catalogue: every row's page exists and shows a copyable example (a fenced block),
and `streamchaos list integrations` names each one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from chaos.output.integrations import INTEGRATIONS

ROOT = Path(__file__).resolve().parent.parent


def test_every_integration_has_a_page_with_an_example() -> None:
    for integration in INTEGRATIONS:
        page = ROOT / "docs" / integration.page
        assert page.is_file(), integration
        assert re.search(r"^```", page.read_text(), re.M), f"{page} shows no copyable example"


def test_list_integrations_names_each_one() -> None:
    out = subprocess.run([sys.executable, "-m", "chaos", "list", "integrations"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for integration in INTEGRATIONS:
        assert integration.name in out.stdout and f"docs/{integration.page}" in out.stdout
