"""Starting a hop's process for the runner, and stopping it: the stream hop (``start_stream_hop``) and
the real gateways (``start_gateway``).

Every hop process is started the same way, so rollback and the watchdog already know how to end it:

- in its own session (its process group is the hop: nginx's workers, LiteLLM's server), with the
  parent-death signal where it can be set (``chaos.host.children.spawn``), so a killed runner leaves
  none behind;
- its output appended to ``run_dir/hops/<name>.log`` (0600, never through a link: ``open_append``);
- journaled as ``{"name": "hop:<name>", "kind": "process.group", "action": "plan", "undo":
  group_undo(pid)}`` the moment it exists, before anything waits on it (the record the vLLM target
  writes: ``streamchaos rollback`` ends the group if the runner could not);
- waited for, bounded: the stream hop's ready line, a gateway answering HTTP on its port (a request
  it answers itself, so nothing reaches the upstream or a tap; over TLS, after a handshake verified
  against the run's CA, and as HTTP/2 where it speaks it: the client preface, answered by its
  SETTINGS); then its listening sockets are read
  from /proc and a hop listening anywhere but loopback is stopped and refused;
- stopped by ``StartedHop.stop()``: SIGTERM to the group, a grace, SIGKILL to whatever is left, and
  ``"action": "release"`` journaled with what it took.

A gateway that serves TLS (``tls: true``, or a user's file naming ``{{cert}}``, ``{{key}}`` or
``{{cert_key}}``) gets the run's certificate (``chaos.host.certs.certs_for_run``: one pair per run, its
CA trusted by this process's clients and handed to the load's) copied into its work directory, and
its ``HopInfo.base_url`` is ``https://``.

A gateway's configuration is checked by its own tool (``nginx -t``, ``haproxy -c``, ``caddy validate``)
before it starts: a user's file it refuses is ``ExperimentInvalid`` (exit 2) quoting the tool's words;
a missing binary is ``SetupFailed`` (exit 4), one line naming the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.hops.gateways.base import (
    TLS_PLACEHOLDERS,
    Gateway,
    Listener,
    Upstream,
    all_values,
    gateway_class,
    loopback_host,
    named_placeholders,
    read_template,
    substitute,
    template_listener,
    write_tls_files,
)
from chaos.host.certs import CertPair, certs_for_run
from chaos.host.children import first_line, spawn
from chaos.host.procguard import group_members, group_undo
from chaos.host.redact import redact, register_secret
from chaos.host.runfiles import check_private_dir, make_private_dir, open_append, write_new
from chaos.host.tls import tls_context
from chaos.model.context import HopInfo
from chaos.model.errors import ExperimentInvalid, Problem, SetupFailed

__all__ = [
    "RESOURCE_KIND", "STREAM_READY", "TOKEN_ENV", "Recorder", "StartedHop", "listening_addresses",
    "start_gateway", "start_stream_hop", "stream_hop_command",
]

# Journals a resource the run created outside this process (``Journal.resource``): one JSON body
Recorder = Callable[[dict[str, Any]], None]
RESOURCE_KIND = "process.group"
STREAM_READY = "streamhop ready "
TOKEN_ENV = "STREAMCHAOS_HOP_TOKEN"
STREAM_READY_TIMEOUT_S = 30.0  # a Python start and h11's import; seconds beside a busy run
STREAM_STOP_GRACE_S = 4.0  # the stream hop exits within 2 s of SIGTERM (its contract); twice that
PROBE_TIMEOUT_S = 2.0
POLL_S = 0.1
# not an HTTP request line, so every server answers it itself (400) and forwards nothing upstream
PROBE = b"\x01 / HTTP/1.1\r\n\r\n"
# an HTTP/2 client's preface and an empty SETTINGS frame: an h2 server answers with its SETTINGS
# (type 4, the 4th byte of a frame's head), and no request is made, so nothing goes upstream
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
H2_SETTINGS = 4
PROBE_ALPN = ("h2", "http/1.1")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (\[\w+\] )?(?:\d+#\d+: )?")  # nginx's: time, pid
_ERROR_WORDS = re.compile(r"emerg|alert|crit|error|fatal|failed|refused|denied", re.IGNORECASE)


@dataclass(eq=False)
class StartedHop:
    """A hop process the run started: where its files are, and ``stop()``."""

    name: str
    kind: str
    pid: int  # the group's leader: its process group id too
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    record: Recorder = field(repr=False)
    grace_s: float = 5.0  # SIGTERM to SIGKILL
    config_path: Path | None = None  # a gateway: the configuration it runs with
    config_text: str = ""  # ... its text, secrets redacted (the report's "effective configuration")
    taps_path: Path | None = None  # a stream hop with taps: one JSON line per request (``TapRecord``)
    released: dict[str, Any] | None = None  # the release's evidence, once stopped
    _ending: asyncio.Future[dict[str, Any]] | None = field(default=None, repr=False)  # a stop in progress

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    async def stop(self) -> dict[str, Any]:
        """End the hop's process group (SIGTERM, ``grace_s``, SIGKILL) and journal the release with
        its evidence; once only (later calls return the same evidence). A cancellation meanwhile
        still finishes the stop, then goes on."""
        if self.released is not None:
            return self.released
        if self._ending is None:  # a second caller meanwhile waits for the same stop
            self._ending = asyncio.ensure_future(asyncio.to_thread(_end_group, self.process, self.grace_s))
        ending = self._ending
        try:
            evidence = await asyncio.shield(ending)
        except asyncio.CancelledError:
            self._release(await ending)
            raise
        return self._release(evidence)

    def _release(self, evidence: dict[str, Any]) -> dict[str, Any]:
        if self.released is None:
            self.released = {**evidence, "log": str(self.log_path)}
            self.record({"name": f"hop:{self.name}", "kind": RESOURCE_KIND, "action": "release",
                         "evidence": self.released})
        return self.released


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _end_group(process: subprocess.Popen[bytes], grace_s: float) -> dict[str, Any]:
    """SIGTERM the group, wait ``grace_s`` for its leader, SIGKILL it and whatever is left. Blocking."""
    started = time.monotonic()
    how = "had exited"
    if process.poll() is None:
        how = "SIGTERM"
        _killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            how = "SIGKILL"
            _killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5.0)
    left = group_members(process.pid)  # what the leader left (it died first, or orphans of a worker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.stdout is not None:
        process.stdout.close()
    return {"pid": process.pid, "status": process.returncode, "how": how, "killed_left": left,
            "stop_s": round(time.monotonic() - started, 3)}


# ---------------------------------------------------------------------------------- shared steps


def _hops_dir(run_dir: Path, name: str) -> Path:
    """``run_dir/hops`` (0700, ours, no link), after checking ``name`` can be a file name there."""
    if not _NAME.fullmatch(name):
        raise SetupFailed(f"hop name {name!r}: use letters, digits, '.', '_' and '-' (64 at most)")
    hops = run_dir / "hops"
    make_private_dir(hops, exist_ok=True)  # relative to the run directory's descriptor (chaos.host.runfiles)
    check_private_dir(hops, "the run's hops directory")
    return hops


def _spawn(command: list[str], log_path: Path, *, env: Mapping[str, str], cwd: Path | None,
           pipe_stdout: bool) -> subprocess.Popen[bytes]:
    """The hop's process: its own session, the parent-death signal, its output in its log."""
    with open_append(log_path) as log:  # 0600, never through a link planted in the run directory
        log.write(f"[streamchaos] {' '.join(command)}\n".encode())
        log.flush()
        process: subprocess.Popen[bytes] = spawn(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe_stdout else log, stderr=log,
            start_new_session=True, env={**os.environ, **env}, cwd=cwd)
    return process


def _journal(record: Recorder, name: str, pid: int) -> None:
    record({"name": f"hop:{name}", "kind": RESOURCE_KIND, "action": "plan", "undo": group_undo(pid)})


def _last_words(log_path: Path) -> str:
    """What the process said last that reads like an error (the last two such lines, repeats and
    nginx's time and pid prefixes dropped), else its last line: usually why it exited."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return "no log"
    said = [_STAMP.sub(r"\1", line.strip()) for line in lines if line.strip() and not line.startswith("[streamchaos]")]
    errors = [line for line in said if _ERROR_WORDS.search(line)]
    distinct = list(dict.fromkeys(errors))[-2:]
    if distinct:
        return " | ".join(line[-300:] for line in distinct)
    return said[-1][-300:] if said else "nothing in its log"


def _decode_address(hexaddr: str) -> str:
    """``/proc/net/tcp{,6}``'s ``HEX:PORT`` (each 32-bit word in host order) as ``host:port``."""
    host_hex, port_hex = hexaddr.split(":")
    raw = b"".join(bytes.fromhex(host_hex[i:i + 8])[::-1] for i in range(0, len(host_hex), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    host = socket.inet_ntop(family, raw)
    return f"{host}:{int(port_hex, 16)}" if family == socket.AF_INET else f"[{host}]:{int(port_hex, 16)}"


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


def listening_addresses(pgid: int) -> list[str]:
    """``host:port`` of every TCP socket the process group ``pgid`` listens on (from /proc)."""
    inodes = _socket_inodes(group_members(pgid))
    found: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                    found.append(_decode_address(fields[1]))
    return sorted(set(found))


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _exposed(pgid: int) -> list[str]:
    """The group's listening addresses that are not loopback: a hop answers this host only."""
    return [a for a in listening_addresses(pgid) if not _is_loopback(a)]


# ---------------------------------------------------------------------------------- the stream hop


def stream_hop_command(name: str, upstream_base: str, taps_path: Path | None, max_events: int | None, *,
                       http: str = "1.1", tls: CertPair | None = None,
                       upstream_cas: tuple[Path, ...] = ()) -> list[str]:
    """``python -m chaos.hops.streamhop ...`` on loopback, ephemeral ports (its token: ``TOKEN_ENV``): HTTP/2
    to its client as well where ``http`` is ``"2"``, over TLS with ``tls``'s certificate, trusting
    ``upstream_cas`` for an https upstream."""
    command = [sys.executable, "-m", "chaos.hops.streamhop", "--name", name, "--listen", "127.0.0.1:0",
               "--upstream", upstream_base, "--control", "127.0.0.1:0"]
    if taps_path is not None:
        command += ["--taps", str(taps_path)]
    if max_events is not None:
        command += ["--max-events", str(max_events)]
    if http != "1.1":
        command += ["--http", http]
    if tls is not None:
        command += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    for ca in upstream_cas:
        command += ["--upstream-ca", str(ca)]
    return command


def _ready_facts(line: str, name: str, log_path: Path, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The stream hop's ready line's JSON, or ``SetupFailed`` saying why there is none."""
    if line.startswith(STREAM_READY):
        with contextlib.suppress(ValueError):
            facts = json.loads(line[len(STREAM_READY):])
            if isinstance(facts, dict) and {"listen", "control", "pid"} <= facts.keys():
                return facts
    status = process.poll()
    why = (f"it exited with status {status} ({_last_words(log_path)})" if status is not None
           else f"no ready line within {STREAM_READY_TIMEOUT_S:g}s" if not line else f"it printed {line[:200]!r}")
    raise SetupFailed(f"stream hop {name!r} did not start: {why}; log: {log_path}")


async def start_stream_hop(name: str, upstream_base: str, run_dir: Path, *, taps: bool, record: Recorder,
                           api_path: str = "/v1", max_events: int | None = None, http: str = "1.1",
                           tls: bool = False) -> tuple[HopInfo, StartedHop]:
    """Start the stream hop ``name`` in front of ``upstream_base`` (``http(s)://host:port``), its taps in
    ``run_dir/hops/<name>.taps.jsonl`` when ``taps``; wait for its ready line (bounded). ``http``: "2"
    speaks HTTP/2 to its client too (h2 by ALPN over TLS, h2c with prior knowledge in the clear);
    ``tls``: it serves the run's certificate (``certs_for_run``), and its ``base_url`` is https. The
    HopInfo's ``base_url`` is its root + ``api_path``; its control token is fresh, registered as a secret.
    An https upstream is verified with the run's CA too, where the run made one (the hop after it, or
    the target, serves the run's certificate)."""
    hops = _hops_dir(run_dir, name)
    log_path = hops / f"{name}.log"
    taps_path = hops / f"{name}.taps.jsonl" if taps else None
    token = secrets.token_urlsafe(32)
    register_secret(token)
    pair = certs_for_run(run_dir) if tls else None
    run_ca = run_dir / "tls" / "ca.pem"
    upstream_cas = (run_ca,) if upstream_base.startswith("https://") and run_ca.is_file() else ()
    command = stream_hop_command(name, upstream_base, taps_path, max_events, http=http, tls=pair,
                                 upstream_cas=upstream_cas)
    process = _spawn(command, log_path, env={TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}, cwd=None, pipe_stdout=True)
    _journal(record, name, process.pid)  # before anything waits on it
    started = StartedHop(name, "stream", process.pid, log_path, process, record, STREAM_STOP_GRACE_S,
                         taps_path=taps_path)
    try:
        line = await asyncio.to_thread(first_line, process, STREAM_READY_TIMEOUT_S)
        facts = _ready_facts(line, name, log_path, process)
        exposed = _exposed(process.pid)
        if exposed or not _is_loopback(str(facts["listen"])):
            raise SetupFailed(f"stream hop {name!r} listens on {', '.join(exposed) or facts['listen']}, "
                              "not loopback only; stopped")
    except BaseException:
        await started.stop()
        raise
    assert process.stdout is not None
    process.stdout.close()  # it prints nothing after its ready line
    scheme = "https" if facts.get("tls") else "http"  # the control API stays plain HTTP on loopback
    info = HopInfo(name=name, kind="stream", listen=str(facts["listen"]), upstream=upstream_base,
                   base_url=f"{scheme}://{facts['listen']}{api_path}", control_url=f"http://{facts['control']}",
                   control_token=token, pid=process.pid, version=str(facts.get("version") or "") or None, taps=taps)
    return info, started


# ---------------------------------------------------------------------------------- the gateways


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refusal(gateway: Gateway, config: Path | None, message: str) -> Exception:
    """A user's configuration the run refuses is a located mistake (exit 2); the shipped one a setup
    failure (exit 4): its options made something the gateway does not take."""
    if config is not None:
        return ExperimentInvalid([Problem(str(config), 0, 0, "config", message)])
    return SetupFailed(f"{gateway.kind}: the shipped configuration: {message}")


def _configure(gateway: Gateway, binary: str, workdir: Path, port: int, upstream_root: str,
               options: Mapping[str, Any] | None, config: Path | None, run_dir: Path) -> tuple[Path, Listener]:
    """Write the hop's configuration into ``workdir`` (the shipped one, or the user's template
    substituted) and the TLS files it reads (``_tls_files``); have the gateway's own tool check it.
    Its path, and what it serves its client."""
    if config is None:
        listener = gateway.listener(options)
        _tls_files(workdir, run_dir, upstream_root, serve=listener.tls, named=False)
        text = gateway.render(port, upstream_root, workdir, options or {})
    else:
        template = read_template(config, needs_listen=gateway.listen_in_config)
        listener = template_listener(template)
        _tls_files(workdir, run_dir, upstream_root, serve=listener.tls,
                   named=bool(named_placeholders(template) & set(TLS_PLACEHOLDERS)))
        text = substitute(template, all_values(port, upstream_root, workdir))
    config_path = workdir / gateway.config_name
    write_new(config_path, text)
    complaint = gateway.check(binary, config_path, workdir)
    if complaint is not None:
        raise _refusal(gateway, config, f"{gateway.kind}'s own check refused it: {complaint}")
    return config_path, listener


def _tls_files(workdir: Path, run_dir: Path, upstream_root: str, *, serve: bool, named: bool) -> None:
    """The run's certificate in the hop's ``tls/`` where it serves TLS (``certs_for_run``: the run's one
    pair, made here if first, its CA trusted by this process from now on), and the run's CA where the
    upstream is https on this host and the run already serves TLS (the hop after it, or the target,
    serves the run's certificate: the gateway verifies it with that CA, not the system's). A user's
    file naming any TLS placeholder gets them all."""
    run_ca = run_dir / "tls" / "ca.pem"
    upstream = Upstream.parse(upstream_root)
    # the run's certificates name this host's loopback only: a remote https upstream keeps the system's CAs
    trust_upstream = upstream.scheme == "https" and loopback_host(upstream.host) and run_ca.is_file()
    if serve or named:
        pair = certs_for_run(run_dir)
        write_tls_files(workdir, chain=pair.cert, key=pair.key, ca=pair.ca if named or trust_upstream else None)
    elif trust_upstream:
        write_tls_files(workdir, ca=run_ca)


async def _probe(port: int, listener: Listener, prior_knowledge: bool) -> bool:
    """Whether something answers HTTP on 127.0.0.1:``port`` (to a request it answers itself): over TLS
    after a handshake verified against the run's CA (``ssl.SSLError`` raised: the caller says why),
    then HTTP/2's preface where ALPN chose h2 (in the clear: where ``prior_knowledge``), else ``PROBE``."""
    context = tls_context(PROBE_ALPN) if listener.tls else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None),
            PROBE_TIMEOUT_S)
    except ssl.SSLError:
        raise
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        if context is not None:
            ssl_object = writer.get_extra_info("ssl_object")
            h2 = ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"
        else:
            h2 = prior_knowledge
        writer.write(H2_PREFACE if h2 else PROBE)
        await writer.drain()
        head = await asyncio.wait_for(reader.read(16), PROBE_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), PROBE_TIMEOUT_S)
    return head.startswith(b"HTTP/") or (h2 and len(head) >= 9 and head[3] == H2_SETTINGS)


def _listens_on(pgid: int, port: int) -> bool:
    """Whether the process group ``pgid`` itself listens on ``port`` (any address of it)."""
    return any(address.rsplit(":", 1)[1] == str(port) for address in listening_addresses(pgid))


async def _wait_answering(gateway: Gateway, name: str, process: subprocess.Popen[bytes], port: int,
                          log_path: Path, listener: Listener) -> None:
    """Until the gateway answers on its port; ``SetupFailed`` with its last word when it exits or
    ``startup_timeout_s`` passes. An answer counts only when the gateway's own process group listens
    there: the port was free when chosen, but another process may have taken it since, and the load
    must not go through a stranger's server under the gateway's name."""
    deadline = time.monotonic() + gateway.startup_timeout_s
    stranger = False
    tls_error = ""
    tries = 0
    while True:
        # in the clear, a user's file may serve h2c alone (HAProxy's `proto h2`), which never answers an
        # HTTP/1.1 request: every other try is HTTP/2's preface
        prior_knowledge = listener.http2 if listener.http2 is not None else tries % 2 == 1
        tries += 1
        try:
            answered = await _probe(port, listener, prior_knowledge)
        except ssl.SSLError as exc:  # it listens, but its TLS is not what the run serves: said if it lasts
            answered, tls_error = False, f" (TLS: {exc.reason or exc})"
        if answered:
            if _listens_on(process.pid, port):
                return
            stranger = True
        if process.poll() is not None:
            raise SetupFailed(f"{gateway.kind} hop {name!r} exited during start-up with status "
                              f"{process.returncode} ({_last_words(log_path)}); log: {log_path}")
        if time.monotonic() > deadline:
            other = (f" (another process answers on 127.0.0.1:{port}, not the gateway: it took the port the run"
                     " chose; run again)") if stranger else ""
            raise SetupFailed(f"{gateway.kind} hop {name!r} did not answer {listener.scheme} on 127.0.0.1:{port}"
                              f" within {gateway.startup_timeout_s:g}s{tls_error}{other}; log: {log_path}")
        await asyncio.sleep(POLL_S)


async def start_gateway(name: str, kind: str | type[Gateway], upstream_root: str, run_dir: Path, *,
                        record: Recorder, options: Mapping[str, Any] | None = None, config: Path | None = None,
                        api_path: str = "/v1", search_path: str | None = None) -> tuple[HopInfo, StartedHop]:
    """Start gateway ``kind`` (a name of ``GATEWAY_KINDS`` or the class) as hop ``name`` in front of
    ``upstream_root`` (``http://host:port``): its shipped configuration with ``options`` (parsed values;
    defaults for the rest), or the user's ``config`` template; checked by its own tool, started,
    journaled, waited for until it answers (bounded), its listening sockets checked for loopback.
    Its work directory is ``run_dir/hops/<name>/``; ``search_path`` replaces PATH when finding it. The
    HopInfo's ``base_url`` is ``https://`` where it serves TLS (the run's certificate: ``_configure``)."""
    gateway = (gateway_class(kind) if isinstance(kind, str) else kind)()
    binary = gateway.find_binary(search_path)  # SetupFailed naming the package: before anything is made
    version = await asyncio.to_thread(gateway.version, binary)
    hops = _hops_dir(run_dir, name)
    workdir = hops / name
    try:
        make_private_dir(workdir)  # fresh: a name is unique in the path
    except FileExistsError:
        raise SetupFailed(f"{gateway.kind} hop {name!r}: {workdir} exists already (two hops of one name?)") from None
    port = _free_port()
    config_path, listener = await asyncio.to_thread(_configure, gateway, binary, workdir, port, upstream_root,
                                                    options, config, run_dir)
    log_path = hops / f"{name}.log"
    process = _spawn(gateway.command(binary, config_path, workdir, port), log_path,
                     env=gateway.environment(workdir), cwd=workdir, pipe_stdout=False)
    _journal(record, name, process.pid)  # before anything waits on it
    started = StartedHop(name, gateway.kind, process.pid, log_path, process, record, gateway.stop_grace_s,
                         config_path=config_path, config_text=redact(config_path.read_text(encoding="utf-8")))
    try:
        await _wait_answering(gateway, name, process, port, log_path, listener)
        exposed = _exposed(process.pid)
        if exposed:
            raise _refusal(gateway, config, f"{gateway.kind} listens on {', '.join(exposed)}: a hop listens on"
                                            " 127.0.0.1 only (write {{listen}} where it listens); it was stopped")
    except BaseException:
        await started.stop()
        raise
    info = HopInfo(name=name, kind=gateway.kind, listen=f"127.0.0.1:{port}", upstream=upstream_root,
                   base_url=f"{listener.scheme}://127.0.0.1:{port}{api_path}", pid=process.pid, version=version)
    return info, started
