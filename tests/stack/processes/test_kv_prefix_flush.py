"""kv.prefix_flush: empties the builtin engine's prefix cache through the admin API; nothing to undo."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from chaos.model.context import RunContext, TargetInfo
from chaos.model.errors import FaultUnsupported
from chaos.stack.process import StackProcess
from faults.kv import KvPrefixFlush

pytestmark = pytest.mark.timeout(60)

PROMPT = list(range(400, 400 + 200))  # token ids: 12 full blocks of 16 cached after one request


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start("--kv-blocks", "128") as proc:
        yield proc


def _fault(raw: dict[str, Any]) -> KvPrefixFlush:
    params, problems = KvPrefixFlush.schema.parse(raw)
    assert not problems, problems
    return KvPrefixFlush.from_params("flush", params)


def _env(stack: StackProcess, tmp_path: Path) -> RunContext:
    target = TargetInfo(kind="builtin", base_url=stack.base_url, admin_url=stack.admin_url,
                        admin_token=stack.admin_token)
    return RunContext(seed=1, target=target, run_dir=tmp_path)


def _cached_tokens(stack: StackProcess) -> int:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    usage = httpx.post(stack.base_url + "/completions", json=body, timeout=30).json()["usage"]
    return int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


def test_a_flush_evicts_the_cached_blocks_and_the_next_request_misses(stack: StackProcess, tmp_path: Path) -> None:
    _cached_tokens(stack)
    assert _cached_tokens(stack) == 192  # warm: every full block but the last token's
    injection = _fault({}).activate(_env(stack, tmp_path))
    assert "cannot be undone" in injection.plan()["note"]
    evidence = asyncio.run(injection.inject())
    assert evidence["evicted"] >= 12 and evidence["after"]["kv_blocks_cached"] == 0, evidence
    assert evidence["before"]["kv_blocks_cached"] == evidence["evicted"], evidence
    assert _cached_tokens(stack) == 0  # recomputed: the flush took effect
    reverted = asyncio.run(injection.revert())
    assert reverted["flushes"] == 1 and reverted["evicted_total"] == evidence["evicted"]
    assert "nothing" in reverted["note"]
    assert "cannot be undone" in KvPrefixFlush.rollback({})["skipped"]


def test_every_flushes_again_while_in_force(stack: StackProcess, tmp_path: Path) -> None:
    async def go() -> dict[str, Any]:
        injection = _fault({"every": "50ms"}).activate(_env(stack, tmp_path))
        await injection.inject()
        for _ in range(200):  # bounded: until a repeat flush landed (a busy box may be slow to schedule it)
            await asyncio.sleep(0.02)
            if injection.flushes >= 3:  # type: ignore[attr-defined]
                break
        return await injection.revert()

    assert asyncio.run(go())["flushes"] >= 3


def test_refused_without_an_admin_api_against_vllm_and_without_a_cache(tmp_path: Path) -> None:
    remote = RunContext(seed=0, target=TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    with pytest.raises(FaultUnsupported, match="admin API"):
        _fault({}).activate(remote)
    vllm = SimpleNamespace(target=SimpleNamespace(kind="vllm"))
    assert "reset_prefix_cache" in _fault({}).problems(vllm)[0][1]  # type: ignore[arg-type]
    off = SimpleNamespace(target=SimpleNamespace(kind="builtin", prefix_caching=False))
    assert "prefix_caching is false" in _fault({}).problems(off)[0][1]  # type: ignore[arg-type]
    with StackProcess.start("--no-prefix-caching") as plain:
        injection = _fault({}).activate(_env(plain, tmp_path))
        with pytest.raises(FaultUnsupported, match="without prefix caching"):
            asyncio.run(injection.inject())
