"""``streamchaos stack serve`` / ``python -m chaos.stack``: run the builtin stack as a process.

Prints exactly one line, ``streamchaos stack ready url=http://HOST:PORT``, once the engine is loaded
and the socket accepts (``--port 0`` binds an ephemeral port). SIGTERM or SIGINT: live requests are
failed (each stream ends with an in-band error and ``[DONE]``), hook faults are removed, KV
reservations released, the engine stopped, and the process exits 0 with every block free.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["READY_PREFIX", "build_parser", "serve_main"]

READY_PREFIX = "streamchaos stack ready url="
log = logging.getLogger("chaos.stack.serve")


def build_parser(prog: str = "streamchaos stack serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve the builtin engine behind an OpenAI-compatible API.")
    p.add_argument("--model", default="tiny", help="'tiny' (seeded random weights) or a Hugging Face checkpoint directory")
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
    p.add_argument("--admin-token", default=os.environ.get("STREAMCHAOS_ADMIN_TOKEN") or None,
                   help="bearer token that opens the admin API to non-loopback clients (env STREAMCHAOS_ADMIN_TOKEN)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the listener says
    # TCP (the protocol class below sets it too, and is what server.nagle switches)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve_main(argv: list[str] | None = None) -> int:
    """Run the stack until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad arguments, 4 when it cannot start."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from chaos.errors import ChaosError

    from .engine import Engine, EngineConfig

    for name in ("kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be at least 1, found {getattr(args, name)}", file=sys.stderr)
            return 2
    config = EngineConfig(
        model=args.model, device=args.device, kv_blocks=args.kv_blocks, block_size=args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, seed=args.seed, dtype=args.dtype,
    )
    try:
        engine = Engine(config)
        sock = _bind(args.host, args.port)
    except (ChaosError, OSError) as exc:
        print(f"streamchaos stack: cannot start: {exc}", file=sys.stderr)
        return 4
    engine.start()
    try:
        return asyncio.run(_serve(engine, sock, args))
    finally:
        engine.shutdown(abort_all=True)


async def _serve(engine: Engine, sock: socket.socket, args: argparse.Namespace) -> int:
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from .server import build_app
    from .sockets import protocol_class

    app = build_app(engine, model_name=args.served_model_name or args.model, admin_token=args.admin_token)
    stack = app.state.stack
    # uvicorn's own HTTP protocol (httptools when installed, else h11), registering each accepted
    # connection so TCP_NODELAY is set on it and server.nagle can reach it
    config = uvicorn.Config(app, http=protocol_class(AutoHTTPProtocol, stack.connections), log_level=args.log_level,
                            access_log=False, lifespan="off", timeout_graceful_shutdown=5, timeout_keep_alive=5)
    loop = asyncio.get_running_loop()

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown and the
            # process would die by the signal instead of exiting 0.
            if self.should_exit:
                self.force_exit = True
                return
            loop.call_soon_threadsafe(self._drain)

        def _drain(self) -> None:
            stack.hooks.clear()
            engine.resume()  # a paused engine would not apply the fails
            n = stack.begin_shutdown()
            log.info("shutting down: failing %d live request(s)", n)
            self.should_exit = True

    server = _Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.005)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY_PREFIX}http://{shown}:{port}", flush=True)

    announcer = asyncio.create_task(announce())
    await server.serve(sockets=[sock])
    announcer.cancel()
    await stack.hooks.aclose()
    released = engine.release_reserved_blocks()
    engine.shutdown(abort_all=True)
    stats = engine.stats()
    held = stats.kv_blocks_used - stats.kv_blocks_reserved
    log.info("stopped: %d reserved block(s) released, %d block(s) still held", released, held)
    if held:
        log.error("KV blocks still held after shutdown: %d (requests %s)", held, ", ".join(stats.leaked_request_ids))
    return 0
