"""A Toxiproxy container only from an image already on the daemon (never a pull), labelled with its
run and journaled before it exists, and removed with its release recorded when it cannot serve.
Against the real daemon `.ci/run` starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chaos.execution.proxy as proxy_module
from chaos.docker.containers import LABEL_RUN_DIR, LABEL_RUN_ID
from chaos.execution.proxy import RunOwner, resolve_server
from chaos.model.errors import SetupFailed

pytestmark = pytest.mark.timeout(120)


def test_an_image_not_on_the_daemon_is_never_pulled(docker_client: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setattr(proxy_module, "DOCKER_IMAGE", "streamchaos-test/absent-toxiproxy:never-pulled")
    with pytest.raises(SetupFailed, match="is not on the Docker daemon, and streamchaos never pulls"):
        resolve_server("docker", None, 1, tmp_path / "log")
    assert not docker_client.images.list(name="streamchaos-test/absent-toxiproxy")  # nothing was fetched
    # auto never makes a container (its API would take orders from every local user): the embedded server
    server = resolve_server("auto", None, 1, tmp_path / "log")
    try:
        assert server.kind == "embedded" and server.token and not server.notes, server.notes
    finally:
        server.stop()


def test_the_container_is_the_runs_journaled_first_and_removed_when_it_cannot_serve(
        docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leftovers: list[str]) -> None:
    """The host skeleton image has no Toxiproxy in it: the container is created, cannot start, and
    must be gone afterwards with plan, id and release in the journal, as a target container's are."""
    from chaos.targets.host_image import host_image

    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setattr(proxy_module, "DOCKER_IMAGE", host_image(docker_client))
    records: list[dict[str, Any]] = []
    owner = RunOwner(run_id="toxi-test-run", run_dir=tmp_path, record=records.append)
    leftovers.append(str(tmp_path))
    with pytest.raises(SetupFailed, match="did not start and answer"):
        resolve_server("docker", None, 1, tmp_path / "log", owner=owner)
    actions = [(r["action"], sorted(r.get("undo", r.get("evidence", {})))) for r in records]
    assert actions[0] == ("plan", ["container_name", "image", "labels"]), records  # before it existed
    assert actions[1] == ("plan", ["container_id"]) and actions[2][0] == "release", records
    labels = records[0]["undo"]["labels"]
    assert labels[LABEL_RUN_ID] == "toxi-test-run" and labels[LABEL_RUN_DIR] == str(tmp_path.resolve())
    assert records[2]["evidence"].get("removed") == records[1]["undo"]["container_id"]
    assert all(r["kind"] == "docker.container" for r in records)  # what `streamchaos rollback` removes
