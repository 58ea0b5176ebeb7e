"""streamchaos is not on PyPI: no message, page or comment tells anyone to `pip install streamchaos` or
`'streamchaos[extra]'` (pip would find nothing, or someone else's package). What works is said instead:
`pip install -e '.[extra]'` in the clone."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from chaos.model.errors import ChaosError

ROOT = Path(__file__).resolve().parent.parent
# `pip install streamchaos`, `pip install 'streamchaos[k8s]'`, `"streamchaos[docker]"`: an install from PyPI
FROM_PYPI = re.compile(r"pip3? install\s+(-U\s+)?streamchaos\b|['\"]streamchaos\[")
WHERE = ("chaos", "faults", "sla", "docs", "scripts", "manifests", "tests")
FILES = ("README.md", "SECURITY.md", "Dockerfile")


def _texts() -> list[Path]:
    found = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for folder in WHERE:
        found += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh", ".yaml", ".yml", ".txt")
                  and p.is_file() and "__pycache__" not in p.parts]
    return found


def test_nothing_says_to_install_streamchaos_from_pypi() -> None:
    this = Path(__file__).resolve()
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in _texts() if path.resolve() != this
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if FROM_PYPI.search(line) and " not in " not in line]  # a test that it is absent says it too
    assert not hits, "streamchaos is not on PyPI; say `pip install -e '.[extra]'` in the clone:\n" + "\n".join(hits)


def _missing(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == module else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_kubernetes_and_docker_refusals_give_the_clone_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.k8s.client import require_client

    _missing(monkeypatch, "kubernetes")
    with pytest.raises(ChaosError) as refused:
        require_client("target.kind: kubernetes")
    assert "pip install -e '.[k8s]'" in str(refused.value) and not FROM_PYPI.search(str(refused.value))

    import builtins

    from chaos.docker.containers import docker_client

    real_import = builtins.__import__

    def no_docker(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "docker":
            raise ImportError("planted: no docker SDK")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_docker)
    with pytest.raises(ChaosError) as refused:
        docker_client(ChaosError, "a docker target")
    assert "pip install -e '.[docker]'" in str(refused.value) and not FROM_PYPI.search(str(refused.value))
