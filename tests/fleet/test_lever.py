"""The fleet lever (chaos.fleet.lever): the host file, the ConfigMap on an API server, the watch a run keeps
while it runs, and the `streamchaos lever` verbs as a user runs them.

Every test points the lever at its own tmp path (``STREAMCHAOS_LEVER_FILE`` or ``LeverSpec.file``): none
touches the host's /var/lib/streamchaos/lever.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.fleet import lever
from chaos.fleet.lever import LeverState, engage_file, lever_file, read_file_lever, release_file, watching_lever
from chaos.model.context import LeverSpec
from chaos.model.errors import FleetSignalError, RunRefused
from chaos.model.observations import Note

ROOT = Path(__file__).resolve().parents[2]
K8S_TESTS = ROOT / "tests" / "k8s"
EVERY = 0.2
HALT_MARGIN_S = 0.5  # the bound asserted: every + this


@pytest.fixture(autouse=True)
def _own_lever_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "lever"
    monkeypatch.setenv(lever.LEVER_FILE_ENV, str(path))
    return path


# -- the file ---------------------------------------------------------------------------------------------


def test_the_file_is_the_spec_s_then_the_environment_s_then_the_default() -> None:
    assert lever_file(LeverSpec(), environ={}) == Path(lever.DEFAULT_FILE) == Path("/var/lib/streamchaos/lever")
    assert lever_file(LeverSpec(), environ={"STREAMCHAOS_LEVER_FILE": "/x/l"}) == Path("/x/l")
    assert lever_file(LeverSpec(file="/y/l"), environ={"STREAMCHAOS_LEVER_FILE": "/x/l"}) == Path("/y/l")


def test_engage_then_release_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "lever"
    assert read_file_lever(path) == LeverState(False, f"file {path}")
    engaged = engage_file(path, "incident 123", "alice@ops")
    assert engaged.engaged and (path.stat().st_mode & 0o777) == 0o644  # every user's runs must read it
    read = read_file_lever(path)
    assert (read.engaged, read.reason, read.by) == (True, "incident 123", "alice@ops")
    assert abs((read.since or 0) - time.time()) < 5
    assert json.loads(path.read_text())["reason"] == "incident 123"
    assert release_file(path).engaged is True and not path.exists()
    assert release_file(path).engaged is False  # idempotent


@pytest.mark.parametrize("content, reason", [
    (b"", None),  # `touch`
    (b"\xff\xfe\x00garbage", None),
    (b'{"reason": 7, "since": "yesterday"}', None),  # JSON of the wrong shapes: engaged all the same
    (b"db migration until 14:00\nsecond line", "db migration until 14:00"),  # `echo ... | sudo tee`
], ids=["empty", "binary", "wrong-json", "plain-text"])
def test_anything_at_the_path_engages_the_lever(tmp_path: Path, content: bytes, reason: str | None) -> None:
    path = tmp_path / "lever"
    path.write_bytes(content)
    state = read_file_lever(path)
    assert state.engaged and state.reason == reason
    assert state.since == pytest.approx(path.stat().st_mtime)  # when it was touched, as the content says nothing
    assert state.by and "the file's owner" in state.by
    assert "reason unknown" in state.describe() or reason in state.describe()


def test_a_folder_or_a_dangling_link_engages_it_too(tmp_path: Path) -> None:
    (tmp_path / "as-dir").mkdir()
    (tmp_path / "as-link").symlink_to(tmp_path / "nowhere")
    assert read_file_lever(tmp_path / "as-dir").engaged and read_file_lever(tmp_path / "as-link").engaged
    assert release_file(tmp_path / "as-dir").engaged and not (tmp_path / "as-dir").exists()


def test_a_path_that_cannot_be_looked_up_is_an_error_not_a_released_lever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: Any) -> Any:  # what a folder on the way without search permission gives (root ignores chmod)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(lever.os, "lstat", denied)
    with pytest.raises(FleetSignalError) as raised:
        read_file_lever(tmp_path / "lever")
    said = str(raised.value)
    assert str(tmp_path / "lever") in said and "Permission denied" in said
    assert f"chmod a+x on {tmp_path}" in said and "STREAMCHAOS_LEVER_FILE" in said


def test_describe_says_where_who_since_why_and_how_to_release() -> None:
    since = time.time() - 192
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    assert LeverState(True, "file /var/lib/streamchaos/lever", "incident 123", "bob@h1", since).describe() == (
        f"the fleet lever (file /var/lib/streamchaos/lever) is ENGAGED by bob@h1 since {stamp} (3m12s ago): "
        "incident 123; release it with `sudo streamchaos lever off`")
    assert LeverState(True, "file /tmp/l").describe() == (
        "the fleet lever (file /tmp/l) is ENGAGED: reason unknown; "
        "release it with `streamchaos lever off --file /tmp/l`")
    other = LeverState(True, "ConfigMap game/stop").describe()
    assert other.endswith("release it with `streamchaos lever off --namespace game --configmap stop`")
    assert LeverState(False, "ConfigMap game/streamchaos-lever", None, "bob@h1", since).describe() == (
        f"the fleet lever (ConfigMap game/streamchaos-lever) is released: released by bob@h1 at {stamp} (3m12s ago)")


async def test_a_run_is_refused_while_the_file_is_there(_own_lever_file: Path) -> None:
    assert await lever.refuse_if_engaged(LeverSpec()) == [LeverState(False, f"file {_own_lever_file}")]
    engage_file(_own_lever_file, "incident 123", "alice@ops")
    with pytest.raises(RunRefused) as refused:
        await lever.refuse_if_engaged(LeverSpec())
    assert refused.value.exit_code == 4
    assert str(refused.value).startswith(f"the run was not started: the fleet lever (file {_own_lever_file}) is "
                                         "ENGAGED by alice@ops since ")
    assert str(refused.value).endswith(
        f"incident 123; release it with `streamchaos lever off --file {_own_lever_file}`")
    print(f"\nstreamchaos: {refused.value}")  # what the CLI prints for it (docs/lever.md)


# -- the watch --------------------------------------------------------------------------------------------


class Recorder:
    """The runner's side of a watch: its halt callback and its note sink."""

    def __init__(self) -> None:
        self.halts: list[tuple[float, str]] = []
        self.notes: list[Note] = []
        self.halted = asyncio.Event()

    def halt(self, why: str) -> None:
        self.halts.append((time.monotonic(), why))
        self.halted.set()

    def emit(self, note: Any) -> None:
        self.notes.append(note)

    def topics(self) -> list[str]:
        return [n.topic for n in self.notes]


async def test_the_watch_halts_within_every_once_the_file_appears(_own_lever_file: Path) -> None:
    spec = LeverSpec(every=EVERY)
    seen = Recorder()
    async with watching_lever(spec, seen.halt, seen.emit):
        await asyncio.sleep(0.5)
        assert not seen.halts
        engaged_at = time.monotonic()
        engage_file(_own_lever_file, "incident 123", "alice@ops")
        await asyncio.wait_for(seen.halted.wait(), EVERY + 2)
        await asyncio.sleep(2 * EVERY)  # nothing more comes: halted once, and the watch has ended
    latency = seen.halts[0][0] - engaged_at
    print(f"\nfile lever: halted {latency * 1000:.0f} ms after it was engaged (every={EVERY}s)")
    assert latency <= EVERY + HALT_MARGIN_S
    assert len(seen.halts) == 1 and "incident 123" in seen.halts[0][1] and "ENGAGED by alice@ops" in seen.halts[0][1]
    assert seen.topics() == ["halt", "lever_watch"]
    halt, summary = seen.notes
    assert halt.data["reason"] == seen.halts[0][1] and halt.data["top_errors"] == []
    assert halt.data["lever"]["engaged"] is True and halt.data["lever"]["where"] == f"file {_own_lever_file}"
    assert summary.data["every_s"] == EVERY and summary.data["unreadable"] == 0
    assert summary.data["reads"] >= 3 and summary.data["where"] == [f"file {_own_lever_file}"]


async def test_a_quiet_watch_ends_with_its_account_only() -> None:
    seen = Recorder()
    async with watching_lever(LeverSpec(every=EVERY), seen.halt, seen.emit):
        await asyncio.sleep(0.5)
    assert seen.topics() == ["lever_watch"] and not seen.halts and seen.notes[0].data["reads"] >= 2


def _dead_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server is a port nobody listens on (connection refused at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "dead",
              "clusters": [{"name": "dead", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}]}
    path = tmp_path / "dead.kubeconfig"
    path.write_text(json.dumps(config))
    return path


async def test_an_unreadable_configmap_refuses_a_run_and_halts_a_running_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kubernetes")
    spec = LeverSpec(namespace="game", kubeconfig=str(_dead_kubeconfig(tmp_path)), every=EVERY)
    with pytest.raises(FleetSignalError) as raised:
        await lever.refuse_if_engaged(spec)
    assert "cannot read the fleet lever (ConfigMap game/streamchaos-lever)" in str(raised.value)
    assert "did not answer" in str(raised.value)

    monkeypatch.setattr(lever, "LEVER_UNREADABLE_HALT_S", 0.6)  # 10 s in a run
    seen = Recorder()
    async with watching_lever(spec, seen.halt, seen.emit):
        await asyncio.wait_for(seen.halted.wait(), 5)
    (_, why), = seen.halts
    assert why.startswith("the fleet lever could not be read for 0.6s (ConfigMap game/streamchaos-lever): ")
    assert seen.topics() == ["halt", "lever_watch"]
    summary = seen.notes[1].data
    assert summary["unreadable"] >= 3 and summary["reads"] >= 1  # the file was read all along
    assert summary["where"][1] == "ConfigMap game/streamchaos-lever" and "did not answer" in summary["last_error"]


# -- the ConfigMap on an API server (the fake, or STREAMCHAOS_TEST_KUBECONFIG's cluster) -------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("kubernetes")
    pytest.importorskip("aiohttp")
    sys.path.insert(0, str(K8S_TESTS))
    try:
        from clusters import open_cluster
    finally:
        sys.path.remove(str(K8S_TESTS))
    with open_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
def namespace(cluster: Any) -> Iterator[str]:
    name = cluster.new_namespace("streamchaos-lever")
    yield name
    cluster.delete_namespace(name)


def _status(exc: Any) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == exc.status
    return dict(body)


@pytest.mark.slow
def test_the_api_server_keeps_configmaps_as_a_real_one_does(cluster: Any, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as missing:
        cluster.core.read_namespaced_config_map("streamchaos-lever", namespace)
    body = _status(missing.value)
    assert missing.value.status == 404 and body["reason"] == "NotFound"
    assert body["message"] == 'configmaps "streamchaos-lever" not found'
    assert body["details"]["name"] == "streamchaos-lever" and body["details"]["kind"] == "configmaps"

    made = cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "lever"},
                                                                 "data": {"engaged": "true"}})
    assert made.data == {"engaged": "true"} and made.metadata.uid and made.metadata.resource_version
    plain = cluster.admin.sanitize_for_serialization(cluster.core.read_namespaced_config_map("lever", namespace))
    assert "status" not in plain and "spec" not in plain and plain["kind"] == "ConfigMap"
    with pytest.raises(ApiException) as exists:
        cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "lever"}, "data": {}})
    assert exists.value.status == 409 and _status(exists.value)["reason"] == "AlreadyExists"
    assert _status(exists.value)["message"] == 'configmaps "lever" already exists'

    stale = made.metadata.resource_version
    replaced = cluster.core.replace_namespaced_config_map("lever", namespace, {
        "metadata": {"name": "lever", "resourceVersion": stale}, "data": {"engaged": "false"}})
    assert replaced.data == {"engaged": "false"} and replaced.metadata.resource_version != stale
    with pytest.raises(ApiException) as conflict:  # compare-and-set on a stale resourceVersion
        cluster.core.replace_namespaced_config_map("lever", namespace, {
            "metadata": {"name": "lever", "resourceVersion": stale}, "data": {"engaged": "true"}})
    assert conflict.value.status == 409 and _status(conflict.value)["reason"] == "Conflict"
    emptied = cluster.core.replace_namespaced_config_map("lever", namespace, {"metadata": {"name": "lever"}})
    assert not emptied.data  # a PUT replaces the object: no data sent, none kept

    deleted = cluster.core.delete_namespaced_config_map("lever", namespace)
    assert cluster.admin.sanitize_for_serialization(deleted)["status"] == "Success"
    with pytest.raises(ApiException) as gone:
        cluster.core.delete_namespaced_config_map("lever", namespace)
    assert gone.value.status == 404


def _runner(cluster: Any, namespace: str, verbs: tuple[str, ...], name: str) -> str:
    from chaos.k8s.rbac import Rule

    return str(cluster.runner_kubeconfig(namespace, [Rule("", "configmaps", verbs, "the fleet lever")], name=name))


@pytest.mark.slow
async def test_the_configmap_lever_engages_releases_and_halts_a_watch(cluster: Any, namespace: str) -> None:
    operator = LeverSpec(namespace=namespace, kubeconfig=_runner(cluster, namespace, ("get", "create", "update"),
                                                                 "operator"))
    run = LeverSpec(namespace=namespace, kubeconfig=_runner(cluster, namespace, ("get",), "run"), every=EVERY)
    states = await lever.refuse_if_engaged(run)  # no ConfigMap: released
    assert [s.engaged for s in states] == [False, False]
    assert states[1].where == f"ConfigMap {namespace}/streamchaos-lever"

    seen = Recorder()
    async with watching_lever(run, seen.halt, seen.emit):
        await asyncio.sleep(0.5)
        assert not seen.halts
        engaged_at = time.monotonic()
        await lever.engage_configmap(operator, "game-day over", "carol@ops")
        await asyncio.wait_for(seen.halted.wait(), EVERY + 5)
    latency = seen.halts[0][0] - engaged_at
    print(f"\nConfigMap lever: halted {latency * 1000:.0f} ms after it was engaged (every={EVERY}s)")
    assert latency <= EVERY + HALT_MARGIN_S
    assert seen.topics() == ["halt", "lever_watch"] and len(seen.halts) == 1
    assert seen.notes[0].data["lever"]["where"] == f"ConfigMap {namespace}/streamchaos-lever"
    assert seen.notes[1].data["unreadable"] == 0 and seen.notes[1].data["reads"] >= 4

    with pytest.raises(RunRefused) as refused:
        await lever.refuse_if_engaged(run)
    assert "is ENGAGED by carol@ops since" in str(refused.value) and "game-day over" in str(refused.value)
    assert f"`streamchaos lever off --namespace {namespace}`" in str(refused.value)

    before = await lever.release_configmap(operator, by="dave@ops")
    assert before.engaged and before.by == "carol@ops"
    data = cluster.core.read_namespaced_config_map("streamchaos-lever", namespace).data
    assert data["engaged"] == "false" and data["by"] == "dave@ops"  # kept, with who released it
    released = await lever.read_configmap_lever(run)
    assert not released.engaged and released.describe().startswith(
        f"the fleet lever (ConfigMap {namespace}/streamchaos-lever) is released: released by dave@ops at ")
    assert (await lever.engage_configmap(operator)).engaged  # replaced in place (update), engaged again
    assert (await lever.read_configmap_lever(run)).engaged


@pytest.mark.slow
async def test_a_configmap_without_engaged_false_is_engaged_and_a_denied_read_names_the_grant(
        cluster: Any, namespace: str) -> None:
    cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "streamchaos-lever"}})
    run = LeverSpec(namespace=namespace, kubeconfig=_runner(cluster, namespace, ("get",), "run"))
    assert (await lever.read_configmap_lever(run)).engaged  # `kubectl create configmap streamchaos-lever`
    blind = LeverSpec(namespace=namespace, kubeconfig=_runner(cluster, namespace, ("list",), "blind"))
    with pytest.raises(FleetSignalError) as denied:
        await lever.read_configmap_lever(blind)
    said = str(denied.value)
    assert "403 Forbidden" in said and 'cannot get resource "configmaps"' in said
    assert '{apiGroups: [""], resources: ["configmaps"], verbs: ["get"]}' in said


# -- the verbs, as a user runs them -------------------------------------------------------------------------


def _streamchaos(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", "lever", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


@pytest.mark.slow
def test_the_lever_verbs_exit_as_documented(tmp_path: Path, _own_lever_file: Path) -> None:
    env = {**os.environ, "STREAMCHAOS_LEVER_FILE": str(_own_lever_file)}
    status = _streamchaos("status", env=env)
    assert (status.returncode, status.stdout) == (0, f"the fleet lever (file {_own_lever_file}) is released\n")
    on = _streamchaos("on", "--reason", "incident 123", env=env)
    assert on.returncode == 0 and on.stdout.startswith(f"engaged: the fleet lever (file {_own_lever_file}) is ENGAGED")
    status = _streamchaos("status", env=env)
    assert status.returncode == 1 and "incident 123" in status.stdout
    print(f"\n$ streamchaos lever status\n{status.stdout}", end="")
    off = _streamchaos("off", env=env)
    assert (off.returncode, off.stdout) == (0, f"released the fleet lever (file {_own_lever_file})\n")
    assert _streamchaos("status", env=env).returncode == 0

    blocked = tmp_path / "a-file"
    blocked.write_text("")  # its "folder" is a file: not writable, even by root
    cannot = _streamchaos("on", env={**env, "STREAMCHAOS_LEVER_FILE": str(blocked / "lever")})
    assert cannot.returncode == 4 and "Traceback" not in cannot.stderr
    assert cannot.stderr.startswith(f"streamchaos: cannot write the fleet lever file {blocked / 'lever'} (")
    assert "run it as root" in cannot.stderr and "STREAMCHAOS_LEVER_FILE" in cannot.stderr
    usage = _streamchaos("sideways", env=env)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
