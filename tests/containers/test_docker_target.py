"""`target.kind: docker` against the real daemon: the container as started, labelled, hardened,
reached, logged and removed; an image target with command, env, volumes and port; start failures
that say why. The pure parts are in tests/test_containers.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from dockerd import free_port

import chaos
from chaos.docker.containers import LABEL_RUN_DIR, LABEL_RUN_ID, run_labels
from chaos.experiment import experiment_from_dict
from chaos.model.errors import SetupFailed
from chaos.targets.host_image import host_image, host_mounts
from chaos.targets.registry import running_target

pytestmark = pytest.mark.timeout(120)


def spec(**target: Any) -> Any:
    return experiment_from_dict({"name": "t", "target": {"kind": "docker", "startup_timeout": "60s", **target},
                                 "phases": [{"name": "p", "duration": "1s"}]}).target


def journal() -> tuple[list[dict[str, Any]], Any]:
    lines: list[dict[str, Any]] = []
    return lines, lines.append


async def test_builtin_stack_in_a_container_is_labelled_hardened_reached_and_removed(
        tmp_path: Path, docker_client: Any, leftovers: list[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    leftovers.append(str(run_dir))
    records, record = journal()
    async with running_target(spec(), target_url=None, run_dir=run_dir, seed=3, run_id="feedc0de",
                              record=record) as target:
        info = target.info
        assert info.kind == "docker" and info.container_id and info.admin_url and info.admin_token
        attrs = docker_client.containers.get(info.container_id).attrs
        assert attrs["Config"]["Labels"][LABEL_RUN_ID] == "feedc0de"
        assert attrs["Config"]["Labels"][LABEL_RUN_DIR] == str(run_dir.resolve())
        host = attrs["HostConfig"]
        assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        assert host["LogConfig"]["Config"]["max-size"] == "64m"
        # a bridge network of the run's own (the default), the port published on loopback only
        assert host["NetworkMode"] == "streamchaos-feedc0de"
        network = docker_client.networks.get("streamchaos-feedc0de")
        assert network.attrs["Labels"][LABEL_RUN_ID] == "feedc0de" and network.attrs["Driver"] == "bridge"
        bindings = [b for ports in attrs["NetworkSettings"]["Ports"].values() for b in ports or []]
        assert bindings and {b["HostIp"] for b in bindings} == {"127.0.0.1"}, bindings
        assert info.base_url == f"http://127.0.0.1:{bindings[0]['HostPort']}/v1"
        assert all(m["RW"] is False for m in attrs["Mounts"] if m["Type"] == "bind")
        assert "--admin-token" not in " ".join(attrs["Config"]["Cmd"])  # the token travels in the environment only
        # it imports chaos from where this runner did (a checkout on PYTHONPATH runs its own code there too)
        assert f"PYTHONPATH={Path(chaos.__file__).resolve().parents[1]}" in attrs["Config"]["Env"]
        # it serves: a streamed completion through the container, and its admin API with the run's token
        async with httpx.AsyncClient(timeout=10) as client:
            reply = await client.post(info.base_url + "/completions",
                                      json={"model": info.model, "prompt": "hello", "max_tokens": 4, "stream": True})
            assert reply.status_code == 200 and "data: [DONE]" in reply.text
            state = await client.get(info.admin_url + "/state", headers={"Authorization": f"Bearer {info.admin_token}"})
            assert state.status_code == 200
        container_id = info.container_id
    # removed on exit, its log kept, and journaled: planned before creation (labels), then with its id, then released
    assert docker_client.containers.list(all=True, filters={"id": container_id}) == []
    assert docker_client.networks.list(names=["streamchaos-feedc0de"]) == []
    assert "streamchaos stack ready" in (run_dir / "container.log").read_text()
    assert [(r["action"], sorted(r.get("undo", r.get("evidence", {})))) for r in records] == [
        ("plan", ["container_name", "image", "labels"]), ("plan", ["container_id"]),
        ("release", ["container", "exit_code", "log", "log_bytes", "networks_removed", "removed", "status"])]
    assert records[0]["undo"]["labels"] == run_labels("feedc0de", run_dir, "target")


async def test_a_host_port_taken_before_the_start_gets_a_fresh_one(tmp_path: Path, docker_client: Any,
                                                                 leftovers: list[str], monkeypatch: Any) -> None:
    """The published port is picked free, then bound by Docker at start: a port another process took
    in between (as on a busy host) costs one container, not the run."""
    import socket

    import chaos.targets.docker as docker_target

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    leftovers.append(str(run_dir))
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    picks: list[int] = []
    real_free_port = docker_target._free_port

    def free_port_taken_twice() -> int:  # the stack's own port, then the first published one
        picks.append(taken if len(picks) < 2 else real_free_port())
        return picks[-1]

    monkeypatch.setattr(docker_target, "_free_port", free_port_taken_twice)
    records, record = journal()
    try:
        async with running_target(spec(), target_url=None, run_dir=run_dir, seed=3, run_id="5eedf00d",
                                  record=record) as target:
            attrs = docker_client.containers.get(target.info.container_id).attrs
            [binding] = [b for ports in attrs["NetworkSettings"]["Ports"].values() for b in ports or []]
            assert int(binding["HostPort"]) == picks[2] != taken
            assert target.info.base_url == f"http://127.0.0.1:{picks[2]}/v1"
            assert len(docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN_ID}=5eedf00d"})) == 1
    finally:
        holder.close()
    assert [r["action"] for r in records] == ["plan", "plan", "plan", "release"]  # both containers journaled


async def test_an_image_target_gets_its_command_env_volumes_and_port(tmp_path: Path, docker_client: Any,
                                                                     leftovers: list[str]) -> None:
    """The image path, with this host's skeleton image standing in for a served image such as vLLM's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    leftovers.append(str(run_dir))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "marker.txt").write_text("mounted")
    port = free_port()
    volumes = [f"{path}:{path}:ro" for path in host_mounts()] + [f"{shared}:/data"]
    target_spec = spec(
        image=host_image(docker_client), port=port, volumes=volumes, model="served-name", network="host",
        env={"STREAMCHAOS_TEST_MARKER": "on", "PYTHONUNBUFFERED": 1, "HOME": "/tmp"},
        command=[sys.executable, "-m", "chaos", "stack", "serve", "--host", "127.0.0.1", "--port", str(port)],
    )
    async with running_target(target_spec, target_url=None, run_dir=run_dir, seed=1, run_id="1mage") as target:
        info = target.info
        assert info.base_url == f"http://127.0.0.1:{port}/v1"
        assert info.model == "tiny"  # what the image serves, not the experiment's name for it
        assert info.admin_url is None  # an image's admin API is not ours to assume
        container = docker_client.containers.get(info.container_id)
        assert "STREAMCHAOS_TEST_MARKER=on" in container.attrs["Config"]["Env"]
        assert container.exec_run(["/usr/bin/cat", "/data/marker.txt"]).output == b"mounted"


async def test_a_container_that_exits_fails_the_start_with_its_last_lines(tmp_path: Path, docker_client: Any,
                                                                         leftovers: list[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    leftovers.append(str(run_dir))
    dying = spec(image=host_image(docker_client), volumes=["/usr:/usr:ro"],
                 command=["/usr/bin/sh", "-c", "echo the model file is missing >&2; exit 3"])
    with pytest.raises(SetupFailed) as caught:
        async with running_target(dying, target_url=None, run_dir=run_dir, seed=1, run_id="d1e"):
            pass
    assert "exit code 3" in str(caught.value) and "the model file is missing" in str(caught.value)
    assert "the model file is missing" in (run_dir / "container.log").read_text()  # kept, then removed


async def test_an_image_the_daemon_lacks_is_refused_without_a_pull(tmp_path: Path, leftovers: list[str]) -> None:
    leftovers.append(str(tmp_path))
    records, record = journal()
    with pytest.raises(SetupFailed, match="not on the Docker daemon: `docker pull streamchaos-test/absent:1`"):
        async with running_target(spec(image="streamchaos-test/absent:1"), target_url=None, run_dir=tmp_path, seed=1,
                                  run_id="x", record=record):
            pass
    # planned before the create, released after it failed: nothing is left outstanding for rollback
    assert [r["action"] for r in records] == ["plan", "release"] and records[1]["evidence"]["why"] == "never created"


async def test_a_missing_volume_source_is_refused_before_anything_is_created(tmp_path: Path,
                                                                             leftovers: list[str]) -> None:
    leftovers.append(str(tmp_path))
    records, record = journal()
    with pytest.raises(SetupFailed, match="/no/such/dir does not exist"):
        async with running_target(spec(volumes=["/no/such/dir:/data"]), target_url=None, run_dir=tmp_path, seed=1,
                                  run_id="v", record=record):
            pass
    assert records == []
