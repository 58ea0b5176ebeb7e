"""Fixtures for the Kubernetes tests: one cluster per session (the fake API server, or the real one
``STREAMCHAOS_TEST_KUBECONFIG`` names), a fresh namespace per test, deleted afterwards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this file (clusters.py, fake_apiserver.py)

pytest.importorskip("kubernetes",
                    reason="the Kubernetes tests need the client: pip install -e '.[dev]' (or '.[k8s]')")
pytest.importorskip("aiohttp", reason="the fake API server needs aiohttp (in the dev extra)")

from clusters import ClusterUnderTest, open_cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUnderTest]:
    with open_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
def namespace(cluster: ClusterUnderTest) -> Iterator[str]:
    name = cluster.new_namespace()
    yield name
    cluster.delete_namespace(name)

