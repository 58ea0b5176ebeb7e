"""Servers we did not write, as real processes on 127.0.0.1: nginx, HAProxy, `transformers serve`, LiteLLM.

Each is installed by the project's own files (`.ci/run`: Debian's nginx and HAProxy, the `thirdparty` extra);
where one is absent its tests skip and say what to install, never silently. Every process is
started on a free port by a fixture and stopped (and waited for) when the fixture ends.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.stack.process import StackProcess

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # `from servers import ...`

from servers import (  # noqa: E402
    LITELLM_KEY,
    ROOT,
    VENV_BIN,
    Served,
    free_port,
    haproxy_conf,
    nginx_conf,
    spawn,
    stop,
    wait_http,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts a server we did not write: marked thirdparty (the folder is slow: tests/conftest.py)."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.thirdparty)


def _tool(name: str, *modules: str) -> Path | None:
    """The console script ``name`` of this environment when the modules it serves with are installed, else None.

    Found, not imported: importing litellm fetches a price list from the internet unless told not to.
    """
    path = VENV_BIN / name
    if not path.is_file():
        return None
    try:
        return path if all(importlib.util.find_spec(m) is not None for m in modules) else None
    except (ImportError, ValueError):
        return None


@pytest.fixture(scope="session")
def builtin_stack() -> Iterator[StackProcess]:
    """A builtin stack (tiny model) for the third-party parts to sit in front of: one for nginx's, HAProxy's
    and LiteLLM's modules, which run on one worker (tests/conftest.py, ONE_WORKER), not one each."""
    stack = StackProcess.start("--port", "0", timeout=60.0)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Callable[[str, str], str]]:
    """``nginx(upstream_url, mode)`` → the URL of a real nginx in front of ``upstream_url``."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None)
    if binary is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light; .ci/run installs it)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstream: str, mode: str) -> str:
        directory = tmp_path / f"nginx-{mode}-{len(procs)}"
        directory.mkdir()
        port = free_port()
        conf = nginx_conf(directory, port, upstream.rstrip("/"), mode)
        proc = spawn([binary, "-p", str(directory), "-c", str(conf)], directory / "stdout.log")
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", proc, 20.0, directory / "error.log")
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``haproxy(upstream_url)`` → the URL of a real HAProxy, its defaults, in front of ``upstream_url``."""
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").is_file() else None)
    if binary is None:
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstream: str) -> str:
        directory = tmp_path / f"haproxy-{len(procs)}"
        directory.mkdir()
        port = free_port()
        conf = haproxy_conf(directory, port, upstream)
        log = directory / "haproxy.log"
        proc = spawn([binary, "-db", "-f", str(conf)], log)
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", proc, 20.0, log)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builtin tiny model, written by our own code as a Hugging Face Llama directory."""
    from chaos.stack.engine.export import export_tiny

    return export_tiny(tmp_path_factory.mktemp("tiny-hf") / "tiny")


@pytest.fixture(scope="module")
def transformers_serve(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`transformers serve` (CPU) serving the exported tiny checkpoint."""
    binary = _tool("transformers", "fastapi", "uvicorn", "transformers.cli.serving")
    if binary is None:
        pytest.skip("transformers serve is not installed: pip install -e '.[thirdparty]' (.ci/run installs it)")
    log = tmp_path_factory.mktemp("transformers-serve") / "serve.log"
    port = free_port()
    # one request at a time (no --continuous-batching: its batcher stalled on the suppress_tokens of
    # an earlier export; the weights now keep fragments out themselves); the first request loads the weights
    proc = spawn([str(binary), "serve", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                  str(tiny_checkpoint)],
                 log, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, 120.0, log)
        yield Served(f"http://127.0.0.1:{port}", log)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def litellm_proxy(builtin_stack: StackProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A LiteLLM proxy with a master key in front of the builtin stack (model name ``tiny``)."""
    binary = _tool("litellm", "litellm", "fastapi", "apscheduler", "orjson")
    if binary is None:
        pytest.skip("the LiteLLM proxy is not installed: pip install -e '.[thirdparty]' (.ci/run installs it)")
    directory = tmp_path_factory.mktemp("litellm")
    config = directory / "config.yaml"
    config.write_text(
        "model_list:\n  - model_name: tiny\n    litellm_params:\n      model: hosted_vllm/tiny\n"
        f"      api_base: {builtin_stack.base_url}\n      api_key: none\n"
        "litellm_settings:\n  callbacks: [\"prometheus\"]\n", encoding="utf-8")
    port = free_port()
    log = directory / "litellm.log"
    proc = spawn([str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                  "--num_workers", "1"],
                 log, env={"LITELLM_MASTER_KEY": LITELLM_KEY, "LITELLM_LOG": "ERROR",
                           "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                           "NO_DOCS": "True"}, cwd=directory)
    try:
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, 180.0, log)
        yield Served(f"http://127.0.0.1:{port}", log)
    finally:
        stop(proc)


LLAMA_CPP_PYTHON_ENV = "STREAMCHAOS_LLAMA_CPP_PYTHON"
LLAMA_CPP_PYTHON_VENV = Path("/var/cache/streamchaos/llama-cpp-python-venv")
LLAMACPP_DIR = Path("/var/cache/streamchaos/llama.cpp")


def _llama_cpp_python_skip(why: str) -> None:
    """Skip loudly, or fail where the llama.cpp tier is required (CI, where both builds must have worked)."""
    if os.environ.get("STREAMCHAOS_TEST_LLAMACPP") == "require":
        pytest.fail(f"STREAMCHAOS_TEST_LLAMACPP=require and {why}")
    pytest.skip(f"LLAMA-CPP-PYTHON TIER SKIPPED: {why}")


@pytest.fixture(scope="module")
def llama_cpp_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Served]]:
    """``llama_cpp_python(*flags)`` → a real llama-cpp-python server (``python -m llama_cpp.server``) on a free
    port serving the builtin tiny model as GGUF, one compute thread, started once per set of flags in the
    module and stopped at its end. Its bindings load the llama.cpp libraries of scripts/build_llama_server.sh
    (``STREAMCHAOS_LLAMACPP_DIR``/lib); its virtualenv is scripts/make_llama_cpp_python_venv.sh's
    (``STREAMCHAOS_LLAMA_CPP_PYTHON``, else the one .ci/run keeps in /var/cache)."""
    if os.environ.get("STREAMCHAOS_TEST_LLAMACPP") == "0":
        pytest.skip("LLAMA-CPP-PYTHON TIER SKIPPED: STREAMCHAOS_TEST_LLAMACPP=0")
    build = Path(os.environ.get("STREAMCHAOS_LLAMACPP_DIR") or LLAMACPP_DIR)
    python = Path(os.environ.get(LLAMA_CPP_PYTHON_ENV) or LLAMA_CPP_PYTHON_VENV / "bin" / "python")
    if not (build / "lib" / "libllama.so").is_file() or not (build / "gguf-py" / "gguf" / "__init__.py").is_file():
        _llama_cpp_python_skip(f"no llama.cpp build at {build} (lib/libllama.so, gguf-py/): run "
                               "scripts/build_llama_server.sh DIR and set STREAMCHAOS_LLAMACPP_DIR=DIR")
    if not python.is_file():
        _llama_cpp_python_skip(f"no llama-cpp-python virtualenv at {python}: run scripts/make_llama_cpp_python_venv.sh "
                               f"VENV {build / 'lib'} and set {LLAMA_CPP_PYTHON_ENV}=VENV/bin/python")
    directory = tmp_path_factory.mktemp("llama-cpp-python")
    gguf = directory / "tiny.gguf"
    subprocess.run([sys.executable, "-m", "chaos.stack.engine.gguf_export", str(gguf), "--gguf-py",
                    str(build / "gguf-py")], check=True, capture_output=True, timeout=120, cwd=ROOT)
    started: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], Served]] = {}

    def start(*flags: str) -> Served:
        if flags in started:
            return started[flags][1]
        port = free_port()
        log = directory / f"server-{len(started)}.log"
        # one compute thread: ggml's threads spin for work, and two beside the suite's workers starve them
        proc = spawn([str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                      "--port", str(port), "--n_threads", "1", "--n_threads_batch", "1", *flags],
                     log, env={"LLAMA_CPP_LIB_PATH": str(build / "lib")})
        try:
            wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 60.0, log)
        except BaseException:
            stop(proc)
            raise
        started[flags] = (proc, Served(f"http://127.0.0.1:{port}", log))
        return started[flags][1]

    yield start
    for proc, _served in started.values():
        stop(proc)
