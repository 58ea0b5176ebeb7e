"""Target kinds are plug-ins: each registered class declares every fact the loader, the dry run, the
support matrix, `streamchaos list` and ``start_target`` read, and a new kind is one class in one module.

The throwaway kind below is registered by the decorator in a fixture and unregistered after it: with
no other module edited, experiments name it, the dry run gives its account, the support matrix has its
column, `streamchaos list targets` shows its keys and ``start_target`` makes it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import main
from chaos.execution.dryrun import dry_run
from chaos.experiment import experiment_from_dict, load_experiment
from chaos.model.context import TargetInfo
from chaos.model.errors import ExperimentInvalid
from chaos.model.experiment import Experiment, TargetSpec
from chaos.model.params import Param, Schema
from chaos.output.catalogue import render_catalogue
from chaos.output.support import NEEDS_WORDS, fault_support, render_markdown, target_columns
from chaos.targets import registry
from chaos.targets.base import (
    COMMON_SECTION,
    TARGET_KINDS,
    Account,
    RemoteTarget,
    SupportColumn,
    Target,
    TargetStart,
    target_kind,
)
from chaos.targets.docker import DockerTarget
from chaos.targets.registry import kinds, start_target, target_class, target_schema

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("builtin", "openai", "vllm", "docker", "kubernetes")
PHASES = [{"name": "p", "duration": "1s"}]


@pytest.mark.parametrize("kind", SHIPPED)
def test_every_shipped_kind_is_registered_and_declares_each_fact(kind: str) -> None:
    cls = kinds()[kind]
    assert cls.kind == kind and isinstance(cls.summary, str) and len(cls.summary) > 20
    assert not inspect.isabstract(cls), f"{kind}: create, dry_run, start and stop must all be its own"
    assert cls.section.names()[:len(COMMON_SECTION.params)] == COMMON_SECTION.names(), "section = common keys + own"
    assert set(cls.own_keys()) <= set(TargetSpec.__dataclass_fields__), f"{kind}: a shipped key with no field"
    assert cls.support and all(isinstance(c, SupportColumn) and c.title for c in cls.support)
    for column in cls.support:
        assert set(column.works) <= set(NEEDS_WORDS), f"{kind}: {column.key} names a need nobody has"
    allowance = cls.startup_allowance_s(TargetSpec(kind=kind))
    assert allowance is None or allowance >= TargetSpec().startup_timeout
    assert isinstance(cls.order, int) and isinstance(cls.started_by_run, bool)


def test_one_list_of_kinds_feeds_the_loader_and_the_matrix() -> None:
    assert tuple(kinds())[:len(SHIPPED)] == SHIPPED  # the loader's choices, in this order
    kind = target_schema().params[0]
    assert kind.name == "kind" and kind.choices == tuple(kinds())
    own = [key for cls in kinds().values() for key in cls.own_keys()]
    assert target_schema().names() == ["kind", *COMMON_SECTION.names(), *dict.fromkeys(own)]
    assert [c.key for c in target_columns()] == ["builtin", "builtin-remote", "vllm", "remote", "docker", "kubernetes"]


def test_a_docker_dry_run_accounts_for_the_container_a_run_starts_without_a_url(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """It said "kind docker needs a URL" and exited 4, while a real run starts the container without one."""
    experiment = load_experiment(ROOT / "experiments" / "container-freeze.yaml")
    assert experiment.target.kind == "docker" and experiment.target.url is None
    code = main(["run", str(ROOT / "experiments" / "container-freeze.yaml"), "--dry-run"])
    out = capsys.readouterr().out
    assert "needs a URL" not in out, out
    assert "target: a container of the builtin stack from this host's Python" in out
    assert "start-up allowance 60s (target.startup_timeout)" in out and "contacted: nothing" in out
    assert code == 0 or (code == 4 and "NOT POSSIBLE HERE" in out), out  # 4 only where the SDK or engine is missing
    # the run and the dry run ask the same question, and a run makes the container
    assert target_class(experiment.target, None) is DockerTarget
    assert isinstance(start_target(experiment.target, target_url=None, run_dir=tmp_path, seed=0), DockerTarget)
    assert target_class(experiment.target, "http://127.0.0.1:9/v1") is RemoteTarget  # --target-url: remote


class Throwaway(Target):
    """A test's target kind: one class, nothing else edited."""

    kind = "test.throwaway"
    summary = "a test's throwaway kind: a server said to be at its own key `where`"
    order = 50
    section = Schema((*COMMON_SECTION.params,
                      Param("where", "str", "http://127.0.0.1:9/v1", doc="test.throwaway: where it listens"),
                      Param("flavours", "str_list", (), doc="test.throwaway: a list, kept hashable")))
    support = (SupportColumn("test.throwaway", "test.throwaway (a test's own)", {"client": "yes", "proxy": "yes"}),)

    def __init__(self, spec: TargetSpec, start: TargetStart) -> None:
        self.spec, self.given = spec, start
        self.info = TargetInfo(kind=self.kind, base_url=str(spec.option("where")), model=spec.model)

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls(spec, start)

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        out.say(f"target: the throwaway at {exp.target.option('where')} (not started now)")
        out.say(f"start-up allowance {cls.startup_allowance_s(exp.target):g}s", 1)
        return TargetInfo(kind=cls.kind, base_url=str(exp.target.option("where")), model=exp.target.model), False

    async def start(self) -> TargetInfo:
        return self.info

    async def stop(self) -> None:
        return None


@pytest.fixture
def throwaway() -> Iterator[type[Throwaway]]:
    kinds()  # the shipped ones first, as a run finds them
    target_kind(Throwaway)
    try:
        yield Throwaway
    finally:
        TARGET_KINDS.pop(Throwaway.kind, None)


def _experiment(target: dict[str, Any]) -> Experiment:
    return experiment_from_dict({"name": "plug-in", "target": target, "phases": PHASES})


def test_a_throwaway_kind_is_named_by_experiments_only_while_registered(throwaway: type[Throwaway]) -> None:
    experiment = _experiment({"kind": "test.throwaway", "where": "http://127.0.0.1:7/v1", "flavours": ["a", "b"]})
    assert experiment.target.kind == "test.throwaway" and experiment.target.option("where") == "http://127.0.0.1:7/v1"
    assert experiment.target.option("flavours") == ("a", "b") and hash(experiment)  # frozen, hashable
    with pytest.raises(ExperimentInvalid, match=r"only a test.throwaway target takes 'where' \(target.kind is builtin"):
        _experiment({"kind": "builtin", "where": "http://127.0.0.1:7/v1"})
    with pytest.raises(ExperimentInvalid, match=r"only a docker target takes 'image' \(target.kind is test.throwaway"):
        _experiment({"kind": "test.throwaway", "image": "vllm/vllm-openai"})
    TARGET_KINDS.pop(throwaway.kind)
    with pytest.raises(ExperimentInvalid, match="expected one of builtin, openai, vllm, docker, kubernetes, found"):
        _experiment({"kind": "test.throwaway"})


def test_a_throwaway_kind_has_a_dry_run_a_support_column_a_listing_and_a_start(throwaway: type[Throwaway],
                                                                                tmp_path: Path) -> None:
    experiment = _experiment({"kind": "test.throwaway", "where": "http://127.0.0.1:7/v1", "startup_timeout": "5s"})
    account = asyncio.run(dry_run(experiment))
    text = "\n".join(account.lines)
    assert "target: the throwaway at http://127.0.0.1:7/v1 (not started now)" in text and "allowance 5s" in text
    assert account.exit_code == 0 and "contacted: nothing" in text, text
    assert fault_support("client.disconnect")["test.throwaway"] == "yes"
    assert fault_support("docker.pause")["test.throwaway"] == "no"
    assert "test.throwaway (a test's own)" in render_markdown(["client.disconnect"], [])
    listing = render_catalogue("targets")
    assert "test.throwaway\n    a test's throwaway kind" in listing and "test.throwaway: where it listens" in listing
    made = start_target(experiment.target, target_url=None, run_dir=tmp_path, seed=7, run_id="r1")
    assert isinstance(made, Throwaway) and made.given.seed == 7 and made.given.run_dir == tmp_path
    assert asyncio.run(made.start()).base_url == "http://127.0.0.1:7/v1"
    assert isinstance(start_target(experiment.target, target_url="http://127.0.0.1:8/v1", run_dir=tmp_path, seed=7),
                      RemoteTarget)  # a URL stands in for it, as for any kind that does not say otherwise


def test_a_distributions_kind_is_found_by_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind outside this package: `kinds` loads each entry point of the group streamchaos.targets."""
    loaded: list[str] = []

    class Point(EntryPoint):
        def load(self) -> Any:
            loaded.append(self.value)
            return target_kind(Throwaway)

    point = Point("throwaway", "elsewhere.targets:Throwaway", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_found", False)
    try:
        assert "test.throwaway" in kinds() and loaded == ["elsewhere.targets:Throwaway"]
    finally:
        TARGET_KINDS.pop(Throwaway.kind, None)


# one experiment's target per shipped kind, each a dry run can account for without a network
DRY_TARGETS: dict[str, dict[str, Any]] = {
    "builtin": {"kind": "builtin"},
    "openai": {"kind": "openai", "url": "http://10.0.0.1:8000/v1"},  # refused by the allow-list: not even read
    "vllm": {"kind": "vllm", "executable": "/nonexistent/python"},
    "docker": {"kind": "docker", "image": "vllm/vllm-openai", "network": "host"},
    "kubernetes": {"kind": "kubernetes", "kubernetes": {"namespace": "serving", "service": "llm"}},  # refused
}


@pytest.mark.parametrize("kind", SHIPPED)
def test_each_kinds_dry_run_says_what_it_would_start_and_its_start_up_allowance(kind: str) -> None:
    experiment = _experiment(DRY_TARGETS[kind])
    account = asyncio.run(dry_run(experiment))
    text = "\n".join(account.lines)
    assert "\ntarget: " in text and "contacted: nothing" in text, text
    allowance = kinds()[kind].startup_allowance_s(experiment.target)
    if allowance is not None:
        assert "start-up allowance" in text or f"startup_timeout {allowance:g}s" in text, text
