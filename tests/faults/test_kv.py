"""kv.pressure: reserving blocks or hogging them with background streams drives queueing/preemption."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.model.context import RunContext, TargetInfo
from chaos.model.errors import FaultUnsupported
from chaos.stack.process import StackProcess
from faults.kv import KvPressure

pytestmark = pytest.mark.timeout(90)

# 64 blocks of 16 tokens: three 200-token requests (13 blocks each) fit easily, until 48 are reserved.
STACK_ARGS = ("--kv-blocks", "64", "--block-size", "16", "--max-num-seqs", "16", "--max-model-len", "1024")


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start(*STACK_ARGS) as proc:
        yield proc


def _env(stack: StackProcess, tmp_path: Path, background: Any = None) -> RunContext:
    target = TargetInfo(kind="builtin", base_url=stack.base_url, admin_url=stack.admin_url,
                        admin_token=stack.admin_token)
    return RunContext(seed=1, target=target, run_dir=tmp_path, background=background)


def _fault(raw: dict[str, Any]) -> KvPressure:
    params, problems = KvPressure.schema.parse(raw)
    assert not problems, problems
    fault = KvPressure.from_params("kv", params)
    assert fault.problems(None) == []
    return fault


async def _load(client: httpx.AsyncClient, stack: StackProcess, n: int,
                max_tokens: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run ``n`` concurrent requests while sampling the engine state; the replies and the peaks seen."""
    peaks = {"num_waiting": 0, "num_preemptions": 0}
    body = {"model": "tiny", "prompt": "pressure " * 4, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    tasks = [asyncio.create_task(client.post(stack.base_url + "/completions", json=body)) for _ in range(n)]
    while not all(t.done() for t in tasks):
        state = (await client.get(stack.admin_url + "/state", headers=stack.admin_headers)).json()
        for key, peak in peaks.items():
            peaks[key] = max(peak, state[key])
        await asyncio.sleep(0.01)
    return [(await t).json() for t in tasks], peaks


def _idle(stack: StackProcess) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        s = httpx.get(stack.admin_url + "/state", headers=stack.admin_headers, timeout=5).json()
        if (s["num_running"], s["num_waiting"], s["kv_blocks_held"]) == (0, 0, 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.01)


def test_reserve_causes_preemption_or_queueing_and_is_released(stack: StackProcess, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMCHAOS_ADMIN_TOKEN", stack.admin_token)  # rollback reads it there
    env = _env(stack, tmp_path)
    fault = _fault({"fraction": 0.75})
    fault = fault.activate(env)
    undo = fault.plan()

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60, headers=stack.admin_headers) as client:
            base_replies, base = await _load(client, stack, 3, 190)
            preempt0 = base["num_preemptions"]
            out: dict[str, Any] = {"base": base, "evidence": await fault.inject()}
            replies, peaks = await _load(client, stack, 3, 190)
            out["peaks"], out["preemptions"] = peaks, peaks["num_preemptions"] - preempt0
            out["texts"] = ([r["choices"][0]["text"] for r in base_replies], [r["choices"][0]["text"] for r in replies])
            out["reverted"] = await fault.revert()
            return out

    out = asyncio.run(go())
    evidence = out["evidence"]
    assert (evidence["requested"], evidence["reserved"]) == (48, 48)
    assert evidence["engine"]["kv_blocks_reserved"] == 48 and evidence["engine"]["kv_blocks_total"] == 64
    assert out["preemptions"] > 0 or out["peaks"]["num_waiting"] > 0, out
    assert out["texts"][0] == out["texts"][1]  # preemption recomputes: same greedy text as without pressure
    assert out["reverted"]["released"] == 48
    state = _idle(stack)
    assert (state["kv_blocks_reserved"], state["kv_blocks_held"], state["leaks_total"]) == (0, 0, 0)
    assert KvPressure.rollback(undo) == {"released": 0}  # idempotent: nothing left to release


def test_reserve_by_blocks_and_rollback(stack: StackProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMCHAOS_ADMIN_TOKEN", stack.admin_token)  # rollback reads it there
    env = _env(stack, tmp_path)
    fault = _fault({"blocks": 10, "method": "reserve"})
    fault = fault.activate(env)
    undo = fault.plan()
    assert asyncio.run(fault.inject())["reserved"] == 10
    assert KvPressure.rollback(undo) == {"released": 10}
    assert "gone" in KvPressure.rollback({"method": "reserve", "admin_url": "http://127.0.0.1:9/admin"})["skipped"]


class _Background:
    """A BackgroundLoad that really streams, as the runner's does, and aborts on stop."""

    def __init__(self, stack: StackProcess) -> None:
        self.stack = stack
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.client = httpx.AsyncClient(timeout=60, headers=stack.admin_headers)

    async def _one(self, prompt_chars: int, max_tokens: int, first: asyncio.Event) -> None:
        # a prompt of its own, as the runner's hog streams have (seeded random text): equal prompts would
        # share their blocks through the prefix cache, and hold a third of the KV
        self.sent = getattr(self, "sent", 0) + 1
        body = {"model": "tiny", "prompt": (f"hog{self.sent} " * prompt_chars)[:prompt_chars],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        async with self.client.stream("POST", self.stack.base_url + "/completions", json=body) as r:
            async for chunk in r.aiter_raw():
                if b'"text"' in chunk:
                    first.set()  # a token: the engine holds this stream's blocks

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int:
        firsts = [asyncio.Event() for _ in range(streams)]
        self.tasks[fault] = [asyncio.create_task(self._one(prompt_chars, max_tokens, f)) for f in firsts]
        # as the runner's generator does: wait (bounded) until each holds its blocks, not a fixed while
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), max(settle_s, 0.01))
        return sum(f.is_set() for f in firsts)

    async def stop(self, fault: str) -> int:
        tasks = self.tasks.pop(fault, [])
        running = sum(not t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return running


def test_hog_fills_the_pool_and_stops_on_revert(stack: StackProcess, tmp_path: Path) -> None:
    async def go() -> dict[str, Any]:
        background = _Background(stack)
        env = _env(stack, tmp_path, background)
        fault = _fault({"method": "hog", "hog_streams": 3, "hog_prompt_chars": 300, "hog_max_tokens": 700})
        fault = fault.activate(env)
        out: dict[str, Any] = {"evidence": await fault.inject()}
        async with httpx.AsyncClient(timeout=60, headers=stack.admin_headers) as client:
            # the inject returns once the hogs hold their prompts' blocks; they fill the pool as they
            # grow. Wait for that (bounded), not for a fixed while: on a quiet box the load below
            # otherwise finished its 30 tokens before the pool was full, and saw no pressure at all
            deadline = time.monotonic() + 30
            while True:
                full = (await client.get(stack.admin_url + "/state", headers=stack.admin_headers)).json()
                if full["kv_blocks_used"] >= full["kv_blocks_total"] - 1 or full["num_preemptions"] > 0 \
                        or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
            out["full"] = {k: full[k] for k in ("kv_blocks_used", "kv_blocks_total", "num_preemptions")}
            _, out["peaks"] = await _load(client, stack, 2, 30)
        out["reverted"] = await fault.revert()
        out["generated_at_revert"] = httpx.get(stack.admin_url + "/state", headers=stack.admin_headers,
                                               timeout=5).json()["generation_tokens_total"]
        await background.client.aclose()
        return out

    out = asyncio.run(go())
    evidence = out["evidence"]
    # read once the three hold their blocks, however busy the box (no fixed while)
    assert evidence["streams_started"] == evidence["streams_holding"] == 3, evidence
    assert evidence["engine"]["kv_blocks_used"] > 32, evidence
    full = out["full"]  # the hogs alone filled the pool (or pressed one of their own out)
    assert full["kv_blocks_used"] >= full["kv_blocks_total"] - 1 or full["num_preemptions"] > 0, out
    assert out["peaks"]["num_waiting"] > 0 or out["peaks"]["num_preemptions"] > 0, out
    assert out["reverted"]["streams_stopped"] >= 1
    state = _idle(stack)
    assert (state["num_running"], state["kv_blocks_held"], state["leaks_total"]) == (0, 0, 0)
    # the hog streams still running at the revert were aborted, not left to finish: hardly a token more
    # (by the engine's own count, not by a wall-clock bound that a busy box breaks)
    assert state["generation_tokens_total"] - out["generated_at_revert"] < 50, (state, out["generated_at_revert"])


def test_hog_needs_a_background_load_and_reserve_needs_admin(tmp_path: Path) -> None:
    env = RunContext(seed=0, target=TargetInfo(kind="vllm", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    with pytest.raises(FaultUnsupported, match="background"):
        _fault({"method": "hog"}).activate(env)
    with pytest.raises(FaultUnsupported, match="method: hog"):
        _fault({"fraction": 0.5}).activate(env)
    params, _ = KvPressure.schema.parse({"method": "reserve"})
    assert "needs 'fraction'" in KvPressure.from_params("kv", params).problems(None)[0][1]
    _, problems = KvPressure.schema.parse({"fraction": 0.5, "blocks": 3})
    assert problems


def test_reserve_under_load_tops_up_as_blocks_come_free(stack: StackProcess, tmp_path: Path) -> None:
    env = _env(stack, tmp_path)
    fault = _fault({"blocks": 56}).activate(env)

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60, headers=stack.admin_headers) as client:
            body = {"model": "tiny", "prompt": "busy " * 8, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
            tasks = [asyncio.create_task(client.post(stack.base_url + "/completions", json=body)) for _ in range(3)]
            while (await client.get(stack.admin_url + "/state",
                                    headers=stack.admin_headers)).json()["kv_blocks_held"] < 20:
                await asyncio.sleep(0.01)
            out: dict[str, Any] = {"evidence": await fault.inject()}
            deadline = asyncio.get_running_loop().time() + 10
            while (state := (await client.get(stack.admin_url + "/state",
                                              headers=stack.admin_headers)).json())["kv_blocks_reserved"] < 56:
                assert asyncio.get_running_loop().time() < deadline, "the reservation never reached its target"
                await asyncio.sleep(0.02)
            out["squeezed"] = state  # 8 blocks left: no 300-token request fits, they all wait
            out["reverted"] = await fault.revert()
            replies = await asyncio.gather(*tasks)
            out["statuses"] = [r.status_code for r in replies]
            return out

    out = asyncio.run(go())
    assert out["evidence"]["reserved"] < 56 and "topping up" in out["evidence"]["note"]
    assert out["squeezed"]["num_waiting"] > 0 and out["squeezed"]["num_preemptions"] > 0
    assert out["statuses"] == [200, 200, 200]  # after revert the load completes (preempted, recomputed)
    assert out["reverted"]["reserved_at_revert"] == 56 and out["reverted"]["released"] == 56
    state = _idle(stack)
    assert (state["kv_blocks_reserved"], state["kv_blocks_held"]) == (0, 0)


def test_revert_during_a_top_up_call_counts_the_blocks_it_took(
    stack: StackProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reserve call whose reply is still on its way when revert comes: the engine has taken the
    blocks, so the fault's tally must include them (a cancelled call used to drop them)."""
    from chaos.admin.client import AdminClient

    real_reserve = AdminClient.reserve
    reply_pending = asyncio.Event()

    async def slow_reply(self: AdminClient, blocks: int, ttl: float | None = None) -> int:
        taken = await real_reserve(self, blocks, ttl)
        if taken and fault._topup is not None and asyncio.current_task() is fault._topup:
            reply_pending.set()
            await asyncio.sleep(0.3)  # the engine holds the blocks; our reply is late
        return taken

    monkeypatch.setattr(AdminClient, "reserve", slow_reply)
    env = _env(stack, tmp_path)
    fault = _fault({"blocks": 56}).activate(env)

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60, headers=stack.admin_headers) as client:
            body = {"model": "tiny", "prompt": "busy " * 8, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
            tasks = [asyncio.create_task(client.post(stack.base_url + "/completions", json=body)) for _ in range(3)]
            while (await client.get(stack.admin_url + "/state",
                                    headers=stack.admin_headers)).json()["kv_blocks_held"] < 20:
                await asyncio.sleep(0.01)
            evidence = await fault.inject()
            await asyncio.wait_for(reply_pending.wait(), 30)  # a top-up took blocks; its reply is pending
            reverted = await fault.revert()
            await asyncio.gather(*tasks)
            return {"evidence": evidence, "reverted": reverted}

    out = asyncio.run(go())
    assert "topping up" in out["evidence"]["note"]
    assert out["reverted"]["released"] > out["evidence"]["reserved"]  # the top-up's blocks were released too
    assert out["reverted"]["reserved_at_revert"] == out["reverted"]["released"], out["reverted"]
    assert "note" not in out["reverted"]
    assert _idle(stack)["kv_blocks_reserved"] == 0
