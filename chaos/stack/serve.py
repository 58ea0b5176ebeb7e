"""``streamchaos stack serve`` / ``python -m chaos.stack``: run the builtin stack as a process.

Prints exactly one line, ``streamchaos stack ready url=http://HOST:PORT``, once the engine is loaded
and the socket accepts (``--port 0`` binds an ephemeral port). SIGTERM or SIGINT: live requests are
failed (each stream ends with an in-band error and ``[DONE]``), hook faults are removed, KV
reservations released, the engine stopped, and the process exits 0 with every block free.

``--tls`` serves HTTPS (the ready line says ``https://``) with ``--tls-cert`` and ``--tls-key``, or,
with neither, a certificate made for this process under a new 0700 directory removed at exit; its
CA is named on stderr and, after the URL, on the ready line (``url=https://HOST:PORT ca=PATH``).
``--http 2`` serves through Hypercorn instead of uvicorn (``chaos.stack.hyper``): h2 by ALPN over
TLS, h2c with prior knowledge without, and HTTP/1.1 to any other client, for the same app.

The admin token comes from ``STREAMCHAOS_ADMIN_TOKEN`` or ``--admin-token-file`` (owner-only mode),
never from the command line, which every user of the host can read in ``/proc/PID/cmdline``. With
neither, a random one is written to a new 0600 file named on stderr and removed at exit. The
server does not read ``X-Forwarded-For``: the peer address is the peer's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from chaos.model.units import UnitError, parse_duration

from .guard import DEFAULT_LIMITS, ServerLimits
from .serve_tls import TlsFiles, TlsUnusable, resolve_tls

if TYPE_CHECKING:
    import uvicorn

    from .engine import Engine
    from .hyper import HyperServer
    from .runtime import Stack
    from .sockets import Connections

__all__ = ["ADMIN_TOKEN_ENV", "READY_PREFIX", "ServeUsageError", "build_parser", "read_token_file",
           "resolve_admin_token", "serve_main"]

READY_PREFIX = "streamchaos stack ready url="
ADMIN_TOKEN_ENV = "STREAMCHAOS_ADMIN_TOKEN"
PARENT_POLL_S = 0.5  # --exit-with-parent: how often the parent id is read
HTTP_VERSIONS = ("1.1", "2")
# what Hypercorn (--http 2) cannot enforce: it has no body deadline (chaos.stack.hyper)
_NOT_OVER_HYPERCORN = ("body_timeout",)
log = logging.getLogger("chaos.stack.serve")


def build_parser(prog: str = "streamchaos stack serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve the builtin engine behind an OpenAI-compatible API.")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (seeded random weights) or a Hugging Face checkpoint directory")
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: --model)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 binds an ephemeral port (printed on the ready line)")
    p.add_argument("--kv-blocks", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="automatic prefix caching of full KV blocks, as vLLM's (default: on)")
    p.add_argument("--reasoning-tokens", default="0", metavar="LO[,HI]",
                   help="a chat answer's first N tokens (N drawn per request in [LO, HI], seeded by its request id) "
                        "stream as delta.reasoning_content, vLLM's shape (default 0: no reasoning)")
    p.add_argument("--admin-token-file", default=None, metavar="PATH",
                   help="file holding the admin API's bearer token (mode 0600); default: env STREAMCHAOS_ADMIN_TOKEN, "
                        "else a random token written to a new 0600 file named on stderr")
    p.add_argument("--admin-token", default=None, help=argparse.SUPPRESS)  # refused: see resolve_admin_token
    p.add_argument("--header-timeout", default=f"{DEFAULT_LIMITS.header_timeout:g}s", metavar="DURATION",
                   help="a request's line and headers must arrive within this (--http 2: a connection's first request; "
                        "default %(default)s)")
    p.add_argument("--body-timeout", default=f"{DEFAULT_LIMITS.body_timeout:g}s", metavar="DURATION",
                   help="a request's body must arrive within this after its headers (not with --http 2; default "
                        "%(default)s)")
    p.add_argument("--keep-alive-timeout", default=f"{DEFAULT_LIMITS.keep_alive_timeout:g}s", metavar="DURATION",
                   help="an idle keep-alive connection is closed after this (default %(default)s)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_LIMITS.max_connections,
                   help="open connections at most; the next is answered 503 and closed (default %(default)s)")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS: with --tls-cert/--tls-key, or, with neither, a certificate made for this process "
                        "(its CA named on stderr and on the ready line; removed at exit)")
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="--tls: the server certificate chain (PEM)")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="--tls: its private key (PEM, unencrypted)")
    p.add_argument("--http", default="1.1", choices=HTTP_VERSIONS,
                   help="1.1: uvicorn (HTTP/1.1); 2: Hypercorn, HTTP/2 (h2 by ALPN over --tls, h2c with prior "
                        "knowledge without) and HTTP/1.1 on the same port (default %(default)s)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--exit-with-parent", type=int, default=None, metavar="PID",
                   help="shut down cleanly once PID is no longer this process's parent (the runner was killed)")
    return p


class ServeUsageError(ValueError):
    """A serve option (the admin token, a limit) cannot be used as given (exit 2)."""


def read_token_file(path: str) -> str:
    """The token in ``path``; ``ServeUsageError`` when it is missing, empty, or readable by others."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            token = f.read(4096).strip()
    except OSError as exc:
        raise ServeUsageError(f"cannot read the admin token file {path}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise ServeUsageError(f"the admin token file {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                              f"run: chmod 600 {path}")
    if not token:
        raise ServeUsageError(f"the admin token file {path} is empty")
    return token


def resolve_admin_token(args: argparse.Namespace,
                        environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[str, str | None]:
    """``(token, generated_file)``: from the environment, ``--admin-token-file``, or a new 0600 file."""
    if args.admin_token is not None:
        raise ServeUsageError(
            "--admin-token is refused: a command line is readable by every user of the host (/proc/PID/cmdline); "
            f"pass the token in the environment ({ADMIN_TOKEN_ENV}) or in a 0600 file (--admin-token-file)"
        )
    if args.admin_token_file:
        return read_token_file(args.admin_token_file), None
    token = environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return token, None
    token = secrets.token_urlsafe(32)
    fd, path = tempfile.mkstemp(prefix="streamchaos-admin-", suffix=".token")  # created 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token, path


def _limits(args: argparse.Namespace) -> ServerLimits:
    try:
        timeouts = {name: parse_duration(getattr(args, name), allow_bare_seconds=True)
                    for name in ("header_timeout", "body_timeout", "keep_alive_timeout")}
    except UnitError as exc:
        raise ServeUsageError(str(exc)) from None
    for name, value in timeouts.items():
        if value <= 0:
            raise ServeUsageError(f"--{name.replace('_', '-')} must be more than 0, found {value:g}s")
    if args.max_connections < 1:
        raise ServeUsageError(f"--max-connections must be at least 1, found {args.max_connections}")
    return ServerLimits(max_connections=args.max_connections, **timeouts)


def _reasoning_tokens(text: str) -> tuple[int, int]:
    from .reasoning import parse_reasoning_tokens

    try:
        return parse_reasoning_tokens(text)
    except ValueError as exc:
        raise ServeUsageError(str(exc)) from None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the listener says
    # TCP (the protocol class below sets it too, and is what server.nagle switches)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _hypercorn_refusals(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``ServeUsageError`` for a limit given with ``--http 2`` that Hypercorn cannot enforce."""
    if args.http != "2":
        return
    given = [name for name in _NOT_OVER_HYPERCORN if getattr(args, name) != parser.get_default(name)]
    if given:
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in given)
        raise ServeUsageError(f"{flags} cannot be applied with --http 2: Hypercorn has no deadline for a request "
                              "body; remove it, or serve --http 1.1")


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerLimits:
    """The limits the options give, every other option checked; ``ServeUsageError`` (exit 2)."""
    for name in ("kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(args, name) < 1:
            raise ServeUsageError(f"--{name.replace('_', '-')} must be at least 1, found {getattr(args, name)}")
    limits = _limits(args)
    _hypercorn_refusals(args, parser)
    args.reasoning_tokens = _reasoning_tokens(args.reasoning_tokens)
    if args.http == "2":
        import importlib.util

        if importlib.util.find_spec("hypercorn") is None:
            raise ServeUsageError("--http 2 needs Hypercorn, which is not installed: pip install hypercorn (it comes "
                                  "with the engine extra)")
    return limits


def serve_main(argv: list[str] | None = None) -> int:
    """Run the stack until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad arguments, 4 when it cannot start."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.ExitStack() as cleanup:  # the files made here go at exit, whatever the exit
        try:
            limits = _options(args, parser)
            tls = resolve_tls(args.tls, args.tls_cert, args.tls_key)  # may make a certificate: after the checks
            if tls is not None:
                cleanup.callback(tls.remove)
            token, token_file = resolve_admin_token(args)
            cleanup.callback(_remove, token_file)
        except (ServeUsageError, TlsUnusable) as exc:
            print(f"streamchaos stack: {exc}", file=sys.stderr)
            return 2
        if token_file is not None:
            print(f"streamchaos stack: admin token written to {token_file} (mode 0600, removed at exit); give it to "
                  f"streamchaos with target.admin_token_file or {ADMIN_TOKEN_ENV}", file=sys.stderr, flush=True)
        if tls is not None and tls.ca is not None:
            print(f"streamchaos stack: serving TLS with a certificate made for this process; clients verify it with "
                  f"the CA {tls.ca} (removed at exit)", file=sys.stderr, flush=True)
        return _run(args, limits, token, tls)


def _run(args: argparse.Namespace, limits: ServerLimits, token: str, tls: TlsFiles | None) -> int:
    """Load the engine, bind, serve until stopped: 0, or 4 where the engine or the socket cannot be had."""
    from chaos.model.errors import ChaosError

    from .engine import Engine, EngineConfig

    config = EngineConfig(
        model=args.model, device=args.device, kv_blocks=args.kv_blocks, block_size=args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, seed=args.seed, dtype=args.dtype, prefix_caching=args.prefix_caching,
    )
    try:
        engine = Engine(config)
        sock = _bind(args.host, args.port)
    except (ChaosError, OSError) as exc:
        print(f"streamchaos stack: cannot start: {exc}", file=sys.stderr)
        return 4
    engine.start()
    try:
        return asyncio.run(_serve(engine, sock, args, token, limits, tls))
    finally:
        engine.shutdown(abort_all=True)


def _remove(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def uvicorn_config(app: Any, limits: ServerLimits, log_level: str = "warning",
                   connections: Connections | None = None, tls: TlsFiles | None = None) -> uvicorn.Config:
    """The uvicorn settings of the builtin server (a function, so a test can read them).

    The HTTP protocol is uvicorn's own h11 one with the connection limits (``guard``), wrapped to
    register every accepted connection in ``connections``, which sets TCP_NODELAY on it and lets
    ``server.nagle`` reach it (``sockets``). ``tls``: HTTPS with these files (no ALPN: HTTP/1.1).
    """
    import uvicorn

    from .guarded_h11 import guarded_protocol
    from .sockets import protocol_class

    protocol = guarded_protocol(limits)
    return uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=5,
        http=protocol_class(protocol, connections) if connections is not None else protocol,
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]  # typed int, used in call_later
        proxy_headers=False, forwarded_allow_ips="",  # X-Forwarded-For is the client's word, not its address
        server_header=False,
        ssl_certfile=tls.cert if tls is not None else None, ssl_keyfile=tls.key if tls is not None else None,
    )


async def _serve(engine: Engine, sock: socket.socket, args: argparse.Namespace, token: str,
                 limits: ServerLimits, tls: TlsFiles | None) -> int:
    from .server import build_app

    app = build_app(engine, model_name=args.served_model_name or args.model, admin_token=token,
                    reasoning_tokens=args.reasoning_tokens)
    stack = app.state.stack
    drain = functools.partial(_drain, engine, stack)
    server: uvicorn.Server | HyperServer
    if args.http == "2":
        from .hyper import HyperServer

        server = HyperServer(app, limits, stack.connections, drain=drain, log_level=args.log_level,
                             ssl_context=tls.context(("h2", "http/1.1")) if tls is not None else None)
    else:
        config = uvicorn_config(app, limits, args.log_level, stack.connections, tls)
        server = _draining_server(config, drain, asyncio.get_running_loop())
    for sig in (signal.SIGTERM, signal.SIGINT):
        # what either server restores when it stops: a signal in the moments between the server's end
        # and the process's (the engine stopped, the token and certificate files removed) is ignored;
        # the default would kill the process there, exit -15 and files left behind
        signal.signal(sig, _stopping)
    announcer = asyncio.create_task(_announce(server, sock, tls))
    orphan_watch = (asyncio.create_task(_exit_with_parent(server, args.exit_with_parent)) if args.exit_with_parent
                    else None)
    await server.serve(sockets=[sock])
    announcer.cancel()
    if orphan_watch is not None:
        orphan_watch.cancel()
    stack.leases.close()
    await stack.hooks.aclose()
    _stop_engine(engine)
    return 0


def _stopping(sig: int, frame: FrameType | None) -> None:
    """A signal once the server has stopped: the process is already on its way out."""


def _drain(engine: Engine, stack: Stack) -> None:
    """The first signal's work, on the loop: fail every live request so its stream ends with an in-band
    error and ``[DONE]``; remove the hook faults and the KV reservation first."""
    stack.leases.close()
    stack.hooks.clear()
    engine.resume()  # a paused engine would not apply the fails
    n = stack.begin_shutdown()
    log.info("shutting down: failing %d live request(s)", n)


def _draining_server(config: uvicorn.Config, drain: Callable[[], None],
                     loop: asyncio.AbstractEventLoop) -> uvicorn.Server:
    """A uvicorn server whose first signal fails every live request (``drain``) before it exits 0;
    a second signal forces the exit."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown and the
            # process would die by the signal instead of exiting 0.
            if self.should_exit:
                self.force_exit = True
                return
            loop.call_soon_threadsafe(self._drain)

        def _drain(self) -> None:
            drain()
            self.should_exit = True

    return _Server(config)


async def _announce(server: uvicorn.Server | HyperServer, sock: socket.socket, tls: TlsFiles | None) -> None:
    """Print the ready line with the bound address once the server has started (not if it is exiting):
    ``url=`` then, for a certificate made here, `` ca=`` and the CA's path (the rest of the line)."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.005)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if tls is not None else "http"
    ca = f" ca={tls.ca}" if tls is not None and tls.ca is not None else ""
    print(f"{READY_PREFIX}{scheme}://{shown}:{port}{ca}", flush=True)


async def _exit_with_parent(server: uvicorn.Server | HyperServer, parent: int) -> None:
    # PR_SET_PDEATHSIG cannot serve a parent that started us from a worker thread (it fires when
    # that thread ends), nor survive every fork: watching our parent id works from any thread.
    while os.getppid() == parent and not server.should_exit:
        await asyncio.sleep(PARENT_POLL_S)
    if not server.should_exit:
        log.warning("parent process %d is gone: shutting down", parent)
        server.handle_exit(signal.SIGTERM, None)


def _stop_engine(engine: Engine) -> None:
    """Release the reserved blocks, abort what is left, and say whether any KV block is still held."""
    released = engine.release_reserved_blocks()
    engine.shutdown(abort_all=True)
    stats = engine.stats()
    held = stats.kv_blocks_used - stats.kv_blocks_reserved
    log.info("stopped: %d reserved block(s) released, %d block(s) still held", released, held)
    if held:
        log.error("KV blocks still held after shutdown: %d (requests %s)", held, ", ".join(stats.leaked_request_ids))
