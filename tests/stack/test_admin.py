"""The admin API: token-only access from any address, bad bodies, hook faults and KV reservation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chaos.admin.client import AdminClient, admin_url_of
from chaos.model.errors import FaultError
from chaos.stack.engine import Engine, EngineConfig
from chaos.stack.process import StackProcess
from chaos.stack.server import build_app

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = Engine(EngineConfig(kv_blocks=64, max_num_seqs=4))
    e.start()
    yield e
    e.shutdown()


async def _get(app: Any, client: tuple[str, int], path: str, token: str | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=client)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=transport, base_url="http://stack") as c:
        return await c.get(path, headers=headers)


@pytest.mark.parametrize(
    ("configured", "client", "sent", "status"),
    [
        (None, "127.0.0.1", None, 403),  # no token configured: closed, even to loopback
        (None, "::1", None, 403),
        (None, "10.1.2.3", "guess", 403),
        ("s3cret", "127.0.0.1", None, 403),  # loopback alone proves nothing (a same-host proxy relays anyone)
        ("s3cret", "127.0.0.1", "wrong", 403),
        ("s3cret", "127.0.0.1", "s3cret", 200),
        ("s3cret", "10.1.2.3", "s3cret", 200),
        ("s3cret", "10.1.2.3", "wrong", 403),
        ("s3cret", "10.1.2.3", None, 403),
    ],
)
def test_admin_access(engine: Engine, configured: str | None, client: str, sent: str | None, status: int) -> None:
    app = build_app(engine, admin_token=configured)
    r = asyncio.run(_get(app, (client, 4242), "/admin/state", sent))
    assert r.status_code == status
    if status == 403:
        assert "admin token" in r.json()["error"]["message"]
    else:
        assert r.json()["kv_blocks_total"] == 64
    # the OpenAI routes are open to everyone
    assert asyncio.run(_get(app, (client, 4242), "/v1/models")).status_code == 200


def test_proof_shows_the_token_without_revealing_it(engine: Engine) -> None:
    from chaos.admin.client import proof_of

    app = build_app(engine, admin_token="s3cret")
    nonce = "n" * 24
    r = asyncio.run(_get(app, ("10.1.2.3", 4242), f"/admin/proof?nonce={nonce}"))
    assert r.status_code == 200 and r.json() == {"server": "streamchaos", "proof": proof_of("s3cret", nonce)}
    assert "s3cret" not in r.text and proof_of("other", nonce) != r.json()["proof"]
    assert asyncio.run(_get(app, ("10.1.2.3", 4242), "/admin/proof?nonce=short")).status_code == 400
    # never a token
    assert asyncio.run(_get(app, ("10.1.2.3", 4242), "/admin/state", r.json()["proof"])).status_code == 403


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/admin/faults/x", b"{"),
        ("PUT", "/admin/faults/x", b'{"type": "timeout", "where": "moon", "fraction": 1}'),
        ("PUT", "/admin/faults/x", b'{"type": "stall", "where": "engine", "duration": 2, "every": 1}'),
        ("PUT", "/admin/faults/x", b""),
        ("POST", "/admin/kv/reserve", b'{"blocks": -1}'),
        ("POST", "/admin/kv/reserve", b'{"blocks": "many"}'),
        ("POST", "/admin/kv/reserve", b"[1]"),
    ],
)
def test_bad_admin_bodies_are_400(stack: StackProcess, admin: Any, method: str, path: str, body: bytes) -> None:
    r = httpx.request(method, stack.url + path, content=body, headers=stack.admin_headers, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_admin_client_round_trip(stack: StackProcess, admin: Any) -> None:
    async def go() -> None:
        async with AdminClient(admin_url_of(stack.base_url), stack.admin_token) as client:
            installed = await client.set_fault("t1", {"type": "timeout", "where": "send", "every_n": 5})
            assert installed["spec"]["every_n"] == 5 and installed["expires_in_s"] > 0
            assert list(await client.faults()) == ["t1"]
            assert (await client.state())["faults"] == ["t1"]
            assert await client.clear_fault("t1") is True
            assert await client.clear_fault("t1") is False
            await client.set_fault("a", {"type": "timeout", "where": "send", "fraction": 0.5})
            await client.set_fault("b", {"type": "timeout", "where": "detokenize", "fraction": 0.5})
            assert await client.clear_all() == 2
            assert await client.reserve(100) == 100
            state = await client.state()
            assert (state["kv_blocks_reserved"], state["kv_blocks_held"]) == (100, 0)
            assert await client.release() == 100
            assert await client.requests() == []
            with pytest.raises(FaultError, match="400"):
                await client.set_fault("bad", {"type": "nope"})

    asyncio.run(go())
