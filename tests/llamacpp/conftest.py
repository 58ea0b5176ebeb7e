"""The llama.cpp tier: llama.cpp's own C++ server (``llama-server``) serving the builtin tiny model as GGUF.

``scripts/build_llama_server.sh`` builds it with cmake from the llama.cpp sources the llama-cpp-python
source distribution vendors (``.ci/run`` does, and keeps the build in /var/cache/streamchaos/llama.cpp
between runs, as it keeps the vLLM virtualenv); the directory comes from ``STREAMCHAOS_LLAMACPP_DIR``,
else that default. The GGUF is written here, from the code under test, with the build's own gguf-py.
Where no build is found every test here skips, saying so; ``STREAMCHAOS_TEST_LLAMACPP=require``
turns that skip into a failure (CI, where the build must have worked). Whole runs: the slow tier.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "thirdparty"))  # the third-party tier's process helpers
sys.path.insert(0, str(HERE))

from llama_servers import LlamaServer  # noqa: E402
from servers import free_port, spawn, stop, wait_http  # noqa: E402

LLAMACPP_DIR_ENV = "STREAMCHAOS_LLAMACPP_DIR"
QUIET = ("--threads", "1", "--threads-batch", "1", "--poll", "0")
DEFAULT_DIR = Path("/var/cache/streamchaos/llama.cpp")


@pytest.fixture(scope="session")
def llamacpp_dir() -> Path:
    """The build's directory (bin/llama-server, gguf-py/); skip (or fail, where required) without one."""
    if os.environ.get("STREAMCHAOS_TEST_LLAMACPP") == "0":
        pytest.skip("LLAMA.CPP TIER SKIPPED: STREAMCHAOS_TEST_LLAMACPP=0")
    where = Path(os.environ.get(LLAMACPP_DIR_ENV) or DEFAULT_DIR)
    missing = [p for p in ("bin/llama-server", "gguf-py/gguf/__init__.py") if not (where / p).is_file()]
    if missing:
        why = (f"no llama.cpp build at {where} (missing {', '.join(missing)}): run scripts/build_llama_server.sh "
               f"[DIR] and set {LLAMACPP_DIR_ENV}=DIR")
        if os.environ.get("STREAMCHAOS_TEST_LLAMACPP") == "require":
            pytest.fail(f"STREAMCHAOS_TEST_LLAMACPP=require and {why}")
        pytest.skip(f"LLAMA.CPP TIER SKIPPED: {why}")
    return where


@pytest.fixture(scope="session")
def tiny_gguf(llamacpp_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builtin tiny model (seed 0) as GGUF, written by the code under test with llama.cpp's gguf-py."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    subprocess.run([sys.executable, "-m", "chaos.stack.engine.gguf_export", str(path), "--gguf-py",
                    str(llamacpp_dir / "gguf-py")], check=True, capture_output=True, timeout=120)
    return path


@pytest.fixture(scope="module")
def llama_server(llamacpp_dir: Path, tiny_gguf: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LlamaServer]]:
    """``llama_server(*flags)`` → a real llama-server on a free port serving the tiny GGUF, started once per set
    of flags in the module and stopped at its end. One compute thread that sleeps while it waits (``QUIET``):
    ggml's threads spin for work, and two of them beside busy test workers on two cores went from 0.1 ms to
    500 ms a token."""
    started: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], LlamaServer]] = {}

    def start(*flags: str) -> LlamaServer:
        if flags in started:
            return started[flags][1]
        log = tmp_path_factory.mktemp("llama-server") / "server.log"
        port = free_port()
        proc = spawn([str(llamacpp_dir / "bin" / "llama-server"), "-m", str(tiny_gguf), "--host", "127.0.0.1",
                      "--port", str(port), *QUIET, *flags], log)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", proc, 60.0, log)
        except BaseException:
            stop(proc)
            raise
        server = LlamaServer(f"http://127.0.0.1:{port}", log, flags)
        started[flags] = (proc, server)
        return server

    yield start
    for proc, _server in started.values():
        stop(proc)
