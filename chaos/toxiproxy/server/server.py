"""The embedded server object, its thread-hosted variant, and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
from typing import Any

from .api import Api, refuse_connection, serve_connection
from .guard import TOKEN_ENV, token_from_environment
from .limits import Limits, ListenPolicy
from .proxy import ApiError, Proxy


class EmbeddedToxiproxy:
    """An API-compatible Toxiproxy (2.12.0) running on the current asyncio loop.

    ``seed`` seeds one ``random.Random`` per server; every connection and toxic derives its own
    generator from it (and the proxy name, connection number, direction and toxic name), so
    jitter, toxicity draws and slicer sizes replay for the same seed and traffic.

    ``token``: a run's server (``chaos.toxiproxy.server.guard``): every route but ``/version`` wants
    ``Authorization: Bearer <token>``, and proxies keep their listen and upstream.
    """

    def __init__(
        self,
        seed: int | None = None,
        config: str | list[dict[str, Any]] | None = None,
        limits: Limits | None = None,
        token: str | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.token = token
        self.connections = 0
        self.rng = random.Random(seed)
        self.seed: int = seed if seed is not None else random.SystemRandom().getrandbits(63)
        self.config = config
        self.proxies: dict[str, Proxy] = {}
        self.api = Api(self)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self.url: str | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Load ``config`` (if any), listen for the API, and return its base URL."""
        self.loop = asyncio.get_running_loop()
        if self.config is not None:
            await self.load_config(self.config)
        self._server = await asyncio.start_server(
            self._connection, host, port, reuse_address=True
        )
        sockname = self._server.sockets[0].getsockname()
        shown = f"[{sockname[0]}]" if ":" in sockname[0] else sockname[0]
        self.url = f"http://{shown}:{sockname[1]}"
        return self.url

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.limits.max_connections:
            await refuse_connection(writer)
            return
        self.connections += 1
        try:
            await serve_connection(self.api, reader, writer)
        finally:
            self.connections -= 1

    async def load_config(self, config: str | list[dict[str, Any]]) -> None:
        """Create proxies from a /populate-format list (or a path to a JSON file with one)."""
        if isinstance(config, str):
            with open(config, encoding="utf-8") as fh:
                config = json.load(fh)
        body = json.dumps(config).encode()
        reply = await self.api.populate(body)
        if reply.status != 201:
            raise ApiError(reply.status, reply.body.decode())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for p in list(self.proxies.values()):
            p.stop()
        self.proxies.clear()
        await asyncio.sleep(0)


class ToxiproxyThread:
    """An :class:`EmbeddedToxiproxy` on its own event loop in a daemon thread, for sync code."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int | None = None,
        config: str | list[dict[str, Any]] | None = None,
        limits: Limits | None = None,
        token: str | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.server = EmbeddedToxiproxy(seed=seed, config=config, limits=limits, token=token)
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> str:
        ready = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                box["url"] = loop.run_until_complete(self.server.start(self.host, self.port))
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                box["error"] = e
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.server.stop())
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="toxiproxy-embedded", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("embedded toxiproxy did not start")
        if "error" in box:
            raise box["error"]
        self.url = box["url"]
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> ToxiproxyThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, found {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, found {text!r}")
    return value


PARENT_POLL_S = 0.5  # --exit-with-parent: how often the parent id is read


async def _exit_with_parent(stop: asyncio.Event, parent: int) -> None:
    # a run killed outright (SIGKILL, OOM) cannot stop the server it started in a session of its own;
    # watching the parent id works however it went (PR_SET_PDEATHSIG fires when the starting thread ends)
    while os.getppid() == parent and not stop.is_set():
        await asyncio.sleep(PARENT_POLL_S)
    if not stop.is_set():
        print(f"toxiproxy: parent process {parent} is gone: shutting down", file=sys.stderr, flush=True)
        stop.set()


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.toxiproxy.server [--host H] [--port P] [--seed N] [--config FILE]``."""
    ap = argparse.ArgumentParser(prog="streamchaos toxiproxy serve",
                                 description="Embedded API-compatible Toxiproxy (2.12.0)",
                                 epilog=f"With {TOKEN_ENV} set (at least 16 characters), every route but /version "
                                        "wants 'Authorization: Bearer <token>', and proxies keep their listen and "
                                        "upstream.")
    ap.add_argument("--host", "-host", default="127.0.0.1")
    ap.add_argument("--port", "-port", type=int, default=8474)
    ap.add_argument("--seed", "-seed", type=int, default=None)
    ap.add_argument("--config", "-config", default=None)
    ap.add_argument("--request-timeout", type=_positive, default=Limits.request_timeout,
                    help="seconds from a request's first byte to the end of its body (default %(default)s)")
    ap.add_argument("--max-connections", type=int, default=Limits.max_connections,
                    help="API connections open at once; more get a 503 and are closed (default %(default)s)")
    ap.add_argument("--loopback-only", action="store_true",
                    help="refuse proxies listening beyond loopback or on a privileged port (403), "
                         "except --allow-listen")
    ap.add_argument("--allow-listen", action="append", default=[], metavar="HOST:PORT",
                    help="a listen address allowed despite --loopback-only (repeatable)")
    ap.add_argument("--exit-with-parent", type=int, default=None, metavar="PID",
                    help="stop once process PID is no longer this server's parent (the run that started it)")
    args = ap.parse_args(argv)
    if args.max_connections < 1:
        ap.error("--max-connections must be at least 1")
    limits = Limits(request_timeout=args.request_timeout, max_connections=args.max_connections,
                    listen=ListenPolicy(args.loopback_only, set(args.allow_listen)))
    try:
        token = token_from_environment()  # from the environment, never argv: a run's server takes only its orders
    except ValueError as e:
        print(f"toxiproxy: cannot start: {e}", file=sys.stderr, flush=True)
        return 1

    async def run() -> int:
        srv = EmbeddedToxiproxy(seed=args.seed, config=args.config, limits=limits, token=token)
        try:
            url = await srv.start(args.host, args.port)
        except (OSError, ApiError, ValueError) as e:
            print(f"toxiproxy: cannot start: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"toxiproxy listening on {url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - not main thread / Windows
                pass
        watch = (asyncio.create_task(_exit_with_parent(stop, args.exit_with_parent))
                 if args.exit_with_parent else None)
        await stop.wait()
        if watch is not None:
            watch.cancel()
        await srv.stop()
        return 0

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:  # pragma: no cover
        return 0
