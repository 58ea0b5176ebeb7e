"""Whether the Docker tests can run here, and why not (shared with the shipped-experiment tests)."""

from __future__ import annotations

import os


def docker_skip_reason() -> str | None:
    """None when a Docker daemon answers and the tests are not switched off; otherwise why they skip."""
    if os.environ.get("STREAMCHAOS_TEST_DOCKER", "").strip() == "0":
        return "STREAMCHAOS_TEST_DOCKER=0"
    from chaos.docker.containers import daemon_problem

    return daemon_problem()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
