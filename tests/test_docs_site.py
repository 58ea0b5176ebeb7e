"""The documentation site: `mkdocs build --strict` (every link, anchor and snippet resolves, every API
object is found), the pages the README links to exist, the API page documents every public name,
the site loads nothing from outside, and one page renders in headless Chromium with the theme's
own script having run."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import chaos

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("getting-started", "concepts", "targets", "kubernetes", "safety", "game-days", "capacity", "scale-out",
         "experiments", "reports", "ci", "faults", "slas", "support", "contracts", "api", "measured", "architecture",
         "security", "cli", "troubleshooting", "dev", "dev/fault", "dev/report-panel", "measured/engine",
         "measured/vllm", "measured/proxy", "measured/load-generator", "measured/through-a-run",
         "measured/long-streams", "measured/docker", "measured/test-suite", "measured/soak", "fleet-signals", "lever",
         "result-formats", "github-action", "opentelemetry", "chaostoolkit", "grafana")
GLOSSARY = ("Phase window", "Population", "End rule", "Censored", "Goodput", "Fluidity", "Injection", "Reach")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("MKDOCS IS NOT INSTALLED: the documentation site was NOT built or checked "
                    "(pip install -c .ci/constraints.txt 'mkdocs-material' 'mkdocstrings[python]'; "
                    "the dev extra has them)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # from the repository root: the snippets (README.md's sections, SECURITY.md) are found from there
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_the_strict_build_has_every_page_the_readme_links_to(site: Path) -> None:
    assert (site / "index.html").is_file() and (site / "report-screenshot.png").is_file()
    for name in PAGES:
        assert (site / name / "index.html").is_file(), f"no page {name}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in re.findall(r"\]\(docs/([a-z/-]+)\.md\)", readme):
        assert page in PAGES, f"the README links to docs/{page}.md, which the site does not build"
    # the generated catalogues and the snippets from README.md made it into the pages
    assert 'id="networklatency"' in _page(site, "faults") and 'id="kv_cleanup"' in _page(site, "slas")
    assert "disconnect-storm" in _page(site, "experiments") and "Exit codes" in (site / "index.html").read_text("utf-8")
    assert "Threat model" in _page(site, "security")


def test_the_api_page_documents_every_public_name(site: Path) -> None:
    ids = set(re.findall(r'id="((?:chaos|sla)\.[\w.]+)"', _page(site, "api")))  # Verdict is sla.base's
    for name in chaos.__all__:
        assert any(i.rsplit(".", 1)[-1] == name for i in ids), (f"chaos.{name} is not documented on the API page: "
                                                                f"{sorted(ids)}")
    assert {"chaos.pytest_plugin.chaos_run", "chaos.pytest_plugin.chaos_stack"} <= ids


def test_the_glossary_defines_each_term(site: Path) -> None:
    concepts = _page(site, "concepts")
    for term in GLOSSARY:
        assert f"<strong>{term}.</strong>" in concepts, term


def test_the_site_loads_nothing_from_outside(site: Path) -> None:
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        fetched = re.findall(r'<(?:link|script|img|iframe)\b[^>]*(?:href|src)="(https?://[^"]*)"', text)
        assert not fetched, f"{page.relative_to(site)} loads {fetched}"


def test_a_page_renders_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    executable = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("HEADLESS CHROMIUM IS NOT INSTALLED: no docs page was rendered "
                    "(Debian: apt-get install chromium; .ci/run installs it)")
    page = site / "targets" / "index.html"
    done = subprocess.run(
        [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert re.search(r'<h1 id="pointing-it-at-your-stack">Pointing it at your stack', dom), dom[:2000]
    assert 'data-md-component="header"' in dom and 'class="md-header' in dom and "md-nav" in dom  # the Material theme
    # the theme's script ran in the browser: it adds the code blocks' buttons, which the built file lacks
    added = ("md-code__button", "md-clipboard")
    raw = page.read_text(encoding="utf-8")
    assert not any(marker in raw for marker in added)
    assert any(marker in dom for marker in added), "Material's script did not run (no code-block buttons in the DOM)"
