"""Tests against a real Docker daemon (`.ci/run` installs and starts one as root).

Every test here is skipped, with the reason, where no daemon answers or ``STREAMCHAOS_TEST_DOCKER=0``.
Containers are started by the code under test, or by ``sidecar`` below; each test checks that none
of its run's containers is left, and the ``leftovers`` fixture removes (and reports) any that are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from dockerd import docker_skip_reason  # noqa: E402

REASON = docker_skip_reason()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Where no Docker daemon answers, every test here skips and says why (the folder is slow: tests/conftest.py)."""
    for item in items:
        path = Path(str(item.fspath))
        if HERE not in path.parents:
            continue
        if REASON is not None:
            item.add_marker(pytest.mark.skip(reason=f"no Docker here: {REASON}"))


@pytest.fixture
def docker_client() -> Iterator[Any]:
    from chaos.docker.containers import docker_client as client_for

    client = client_for()
    yield client
    client.close()


@pytest.fixture
def leftovers(docker_client: Any) -> Iterator[list[str]]:
    """Run directories whose containers and networks must all be gone at the end; any left is
    removed, then the test fails."""
    from chaos.docker.containers import LABEL_RUN_DIR

    run_dirs: list[str] = []
    yield run_dirs
    left = []
    for run_dir in run_dirs:
        resolved = str(Path(run_dir).resolve())
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN_DIR}={resolved}"}):
            left.append(f"{container.short_id} ({container.status}) of {resolved}")
            container.remove(force=True)
        for network in docker_client.networks.list(filters={"label": f"{LABEL_RUN_DIR}={resolved}"}):
            left.append(f"network {network.name} of {resolved}")
            network.remove()
    assert not left, f"containers left behind: {left}"


@pytest.fixture
def sidecar(docker_client: Any) -> Iterator[Any]:
    """``sidecar(labels)`` → a running container (this host's ``sleep`` in the skeleton image) the test owns."""
    from chaos.targets.host_image import host_image

    started: list[Any] = []

    def start(labels: dict[str, str]) -> Any:
        image = host_image(docker_client)
        container = docker_client.containers.run(image, ["/usr/bin/sleep", "300"], detach=True, network_mode="none",
                                                 volumes={"/usr": {"bind": "/usr", "mode": "ro"}}, labels=labels,
                                                 user=f"{os.getuid()}:{os.getgid()}")
        started.append(container)
        return container

    yield start
    import docker.errors

    for container in started:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # the test removed it (rollback did)
