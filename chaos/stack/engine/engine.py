"""The engine loop: its own thread, continuous batching over a paged KV cache.

Threading model: one engine thread owns the model and the KV tensors. All bookkeeping (scheduler,
block manager, live requests, counters) is guarded by ``self._cond``'s lock; the lock is *released*
during the forward pass, so ``stats()``, ``abort()``, ``reserve_blocks()`` etc. never wait on the
model. Requests added, aborted or failed from other threads are queued as commands and applied at
the next step boundary. ``on_output`` callbacks run on the engine thread, outside the lock.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .block_manager import BlockManager
from .forward import forward_batch
from .kv_cache import KVCache
from .model import CausalLM, build_tiny, load_hf
from .scheduler import RUNNING, Scheduler, Sequence
from .tokenizer import Tokenizer
from .types import (
    DuplicateRequest,
    EngineConfig,
    EngineSetupFailed,
    EngineStats,
    EngineStopped,
    Histogram,
    InvalidRequest,
    PromptTooLong,
    SamplingParams,
    TokenOutput,
)
from .utf8 import Utf8Constraint

log = logging.getLogger("chaos.stack.engine")

# Intra-op threads on CPU, chosen by measurement (benchmarks/bench_engine.py; 2-core VM, tiny
# model, torch 2.13.0+cpu, end to end through the engine thread; runs vary by ~+-30%):
#                                            1 thread    2 threads
#   decode tok/s, batch 1                      1349          667
#   decode tok/s, batch 8                      5601         1687
#   decode tok/s, batch 32                     7176         5056
#   idle TTFT p50, 32-token prompt            3.4 ms       4.1 ms
# The ops are tiny; the second thread costs more in pool wake-ups than it gains (and it competes
# with the server's event loop for the other core). Hence 1.
DEFAULT_CPU_THREADS = 1

PAUSE_MAX_S = 60.0
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

OutputCallback = Callable[[TokenOutput], None]


def resolve_device(spec: str) -> torch.device:
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise EngineSetupFailed(f"device {spec!r} requested but CUDA is not available")
        dev = torch.device(spec)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise EngineSetupFailed(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return dev
    raise EngineSetupFailed(f"unknown device {spec!r} (auto, cpu, cuda, cuda:N)")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if config.dtype not in _DTYPES:
            raise EngineSetupFailed(f"unknown dtype {config.dtype!r} ({', '.join(_DTYPES)})")
        dtype = _DTYPES[config.dtype]
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or DEFAULT_CPU_THREADS)
        if config.block_size <= 0 or config.kv_blocks <= 0 or config.max_num_seqs <= 0:
            raise EngineSetupFailed("kv_blocks, block_size and max_num_seqs must be positive")
        t0 = time.perf_counter()
        self.tokenizer, model = self._load_model(config)
        self.model: CausalLM = model.to(device=self.device, dtype=dtype)
        cfg = self.model.config
        self.kv = KVCache(cfg.num_hidden_layers, config.kv_blocks, config.block_size, cfg.num_key_value_heads,
                          cfg.dim_head, dtype, self.device)
        self.load_seconds = time.perf_counter() - t0
        self.vocab_size = cfg.vocab_size
        # random weights need a UTF-8 validity mask to produce well-formed text (see utf8.py)
        self._utf8 = Utf8Constraint(self.tokenizer, cfg.vocab_size) if config.model == "tiny" else None
        self._utf8_bias = self._utf8.bias.to(self.device) if self._utf8 is not None else None
        self.bm = BlockManager(config.kv_blocks, config.block_size, prefix_caching=config.prefix_caching)
        self.scheduler = Scheduler(self.bm, config.max_num_seqs, config.max_num_batched_tokens)
        self._cond = threading.Condition(threading.Lock())
        self._seqs: dict[str, Sequence] = {}  # live: pending + waiting + running
        self._pending_adds: list[Sequence] = []
        self._pending_kills: dict[str, tuple[str, str | None]] = {}
        self._seed_rng = random.Random(config.seed)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._abort_on_stop = True
        self._closed = False
        self._paused_until: float | None = None
        self._idle_checked = True
        self.step_hook: Callable[[list[str]], Mapping[str, str]] | None = None
        # counters
        self.invariant_violations = 0  # used + free == total (and tables + reserved == used) broken
        self._leaks_total = 0
        self._leaked_ids: tuple[str, ...] = ()
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._steps_total = 0
        self._prefix_queries_total = 0  # prompt tokens looked up in the prefix cache
        self._prefix_hits_total = 0  # prompt tokens served from it
        self._queue_time = Histogram()
        self._prefill_time = Histogram()

    @staticmethod
    def _load_model(config: EngineConfig) -> tuple[Tokenizer, CausalLM]:
        if config.model == "tiny":
            tok = Tokenizer.load()
            return tok, build_tiny(tok.vocab_size, seed=config.seed)
        p = Path(config.model)
        if not p.is_dir():
            raise EngineSetupFailed(f"model {config.model!r}: not 'tiny' and not a checkpoint directory")
        try:
            model = load_hf(p)
        except EngineSetupFailed:
            raise
        except Exception as e:
            raise EngineSetupFailed(f"model {config.model!r}: {e}") from e
        if (p / "tokenizer.json").is_file():
            tok = Tokenizer.load(p)
        else:
            tok = Tokenizer.load()
            if tok.vocab_size > model.config.vocab_size:
                raise EngineSetupFailed(f"{p}: no tokenizer.json and the builtin tokenizer does not fit the vocab")
            log.warning("%s has no tokenizer.json; using the builtin tokenizer", p)
        return tok, model

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._closed:
                raise EngineStopped("engine was shut down")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="streamchaos-engine", daemon=True)
            self._thread.start()

    def shutdown(self, abort_all: bool = True, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._stop = True
            self._abort_on_stop = abort_all
            self._paused_until = None
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            outs: list[tuple[OutputCallback, TokenOutput]] = []
            with self._cond:
                self._apply_commands(outs)
                self._abort_everything(outs)
            self._dispatch(outs)
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("engine thread did not stop within %.1f s", timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- requests -----------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    on_output: OutputCallback) -> None:
        ids = [int(t) for t in prompt_token_ids]
        self._check_request(ids, params)
        with self._cond:
            if self._closed:
                raise EngineStopped("engine is shut down")
            if request_id in self._seqs:
                raise DuplicateRequest(f"request id {request_id!r} is already live")
            gen = None
            if params.temperature > 0:
                seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
                gen = torch.Generator(device=self.device)
                gen.manual_seed(int(seed))
            seq = Sequence(request_id, ids, params, on_output, generator=gen)
            self._seqs[request_id] = seq
            self._pending_adds.append(seq)
            self._cond.notify_all()

    def _check_request(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse a prompt this model and cache cannot take, and sampling parameters out of range."""
        if not ids:
            raise InvalidRequest("prompt is empty")
        if any(t < 0 or t >= self.vocab_size for t in ids):
            raise InvalidRequest(f"prompt has token ids outside [0, {self.vocab_size})")
        if len(ids) > self.config.max_model_len:
            raise PromptTooLong(
                f"prompt has {len(ids)} tokens; this model's context is {self.config.max_model_len} tokens")
        if self.bm.blocks_needed(len(ids) + 1) > self.bm.num_total:
            raise PromptTooLong(
                f"prompt has {len(ids)} tokens; the KV cache holds {self.bm.num_total * self.bm.block_size}")
        if params.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1")
        if params.temperature < 0:
            raise InvalidRequest("temperature must be >= 0")
        if not 0 < params.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]")

    def abort(self, request_id: str) -> None:
        self._kill(request_id, "abort", None)

    def fail(self, request_id: str, message: str) -> None:
        self._kill(request_id, "error", message)

    def _kill(self, request_id: str, reason: str, message: str | None) -> None:
        with self._cond:
            if request_id in self._seqs and request_id not in self._pending_kills:
                self._pending_kills[request_id] = (reason, message)
                self._cond.notify_all()

    # -- faults --------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Stall the loop at the next step boundary (nothing is applied while paused, not even
        aborts: a stalled engine is stalled). Auto-expires after 60 s."""
        with self._cond:
            self._paused_until = time.monotonic() + PAUSE_MAX_S
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused_until = None
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._is_paused()

    def _is_paused(self) -> bool:
        if self._paused_until is None:
            return False
        if time.monotonic() >= self._paused_until:
            log.warning("engine pause expired after %.0f s", PAUSE_MAX_S)
            self._paused_until = None
            return False
        return True

    def reserve_blocks(self, n: int) -> int:
        with self._cond:
            k = self.bm.reserve(n)
            self._check_invariant()
            return k

    def release_reserved_blocks(self) -> int:
        with self._cond:
            k = self.bm.release_reservation()
            self._check_invariant()
            self._cond.notify_all()
            return k

    def reset_prefix_cache(self) -> tuple[int, int]:
        """Forget every cached prefix (vLLM's ``/reset_prefix_cache``): ``(free cached blocks evicted,
        held blocks whose prefix no longer serves hits)``. Requests holding blocks keep them."""
        with self._cond:
            out = self.bm.reset_prefix_cache()
            self._check_invariant()
            return out

    # -- observation -----------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting) + len(self._pending_adds),
                kv_blocks_used=self.bm.num_used,
                kv_blocks_total=self.bm.num_total,
                kv_blocks_reserved=self.bm.num_reserved,
                num_preemptions=self.scheduler.num_preemptions,
                leaks_total=self._leaks_total,
                leaked_request_ids=self._leaked_ids,
                prompt_tokens_total=self._prompt_tokens_total,
                generation_tokens_total=self._generation_tokens_total,
                steps_total=self._steps_total,
                prefix_cache_queries_total=self._prefix_queries_total,
                prefix_cache_hits_total=self._prefix_hits_total,
                kv_blocks_cached=self.bm.num_cached_free,
                prefix_caching=self.bm.prefix_caching,
                queue_time=self._queue_time,
                prefill_time=self._prefill_time,
            )

    def live_requests(self) -> list[dict[str, Any]]:
        with self._cond:
            out = []
            for seq in self._seqs.values():
                if seq.state == RUNNING:
                    state = "running"
                elif seq.preemptions:
                    state = "preempted"
                else:
                    state = "waiting"
                out.append({
                    "id": seq.request_id,
                    "state": state,
                    "prompt_tokens": len(seq.prompt_ids),
                    "completion_tokens": len(seq.output_ids),
                    "blocks": self.bm.num_blocks_of(seq.request_id),
                })
            return out

    def _idle_locked(self) -> bool:
        return not self._pending_adds and not self._pending_kills and not self.scheduler.has_work()

    def wait_idle(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(self._idle_locked, timeout)

    # -- engine thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            outs: list[tuple[OutputCallback, TokenOutput]] = []
            with self._cond:
                do_step, exiting = self._decide(outs)
            self._dispatch(outs)
            if exiting:
                with self._cond:
                    self._check_leak()
                    self._cond.notify_all()
                return
            if do_step:
                self._step()

    def _decide(self, outs: list[tuple[OutputCallback, TokenOutput]]) -> tuple[bool, bool]:
        """Under the lock: apply the commands, then whether to step and whether to exit; idle, wait a little."""
        paused = False if self._stop else self._is_paused()
        if not paused:
            self._apply_commands(outs)
        if self._stop:
            if self._abort_on_stop:
                self._abort_everything(outs)
            if not self.scheduler.has_work():
                return False, True
        if not paused and self.scheduler.has_work():
            return True, False
        if not outs:
            self._idle_wait(paused)
        return False, False

    def _idle_wait(self, paused: bool) -> None:
        """Nothing to do: check for leaks (not while paused), wake ``wait_idle()``, wait for a command."""
        if not paused:
            self._check_leak()
        self._cond.notify_all()  # wake wait_idle()
        until = self._paused_until
        wait = 1.0 if until is None else max(0.0, min(1.0, until - time.monotonic()))
        self._cond.wait(wait)

    def _apply_commands(self, outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        for seq in self._pending_adds:
            self.scheduler.add(seq)
        self._pending_adds.clear()
        kills, self._pending_kills = self._pending_kills, {}
        for rid, (reason, message) in kills.items():
            killed = self._seqs.get(rid)
            if killed is not None:
                self._finish(killed, reason, outs, error=message)

    def _abort_everything(self, outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        for seq in list(self._seqs.values()):
            self._finish(seq, "abort", outs)

    def _finish(self, seq: Sequence, reason: str, outs: list[tuple[OutputCallback, TokenOutput]],
                new_ids: tuple[int, ...] = (), error: str | None = None) -> None:
        self.scheduler.remove(seq)
        self._seqs.pop(seq.request_id, None)
        outs.append((seq.on_output, TokenOutput(seq.request_id, new_ids, True, reason, len(seq.prompt_ids),
                                                len(seq.output_ids), error, seq.num_cached_tokens)))

    def _check_invariant(self, full: bool = False) -> None:
        try:
            self.bm.check(full)
        except AssertionError as e:  # must never happen; count it instead of killing the thread
            self.invariant_violations += 1
            log.error("KV block accounting invariant violated: %s", e)

    def _check_leak(self) -> None:
        if self._idle_checked:
            return
        self._idle_checked = True
        self._check_invariant(full=True)
        if self.bm.num_used_by_seqs != 0:
            holders = tuple(self.bm.holders())
            self._leaks_total += 1
            self._leaked_ids = holders
            log.warning("KV leak at idle: %d blocks still held by request(s) %s",
                        self.bm.num_used_by_seqs, ", ".join(holders) or "?")

    def _dispatch(self, outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        for cb, out in outs:
            try:
                cb(out)
            except Exception:
                log.exception("on_output callback for %s raised", out.request_id)

    def _run_step_hook(self, hook: Callable[[list[str]], Mapping[str, str]],
                       outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        """The step hook (a planted engine fault) names running requests to fail this step; they end in error."""
        with self._cond:
            ids = [s.request_id for s in self.scheduler.running]
        try:
            to_fail = dict(hook(ids) or {})
        except Exception:
            log.exception("step_hook raised")
            return
        with self._cond:
            for rid, msg in to_fail.items():
                victim = self._seqs.get(rid)
                if victim is not None:
                    self._finish(victim, "error", outs, error=str(msg))

    def _forward(self, p_items: list[tuple[str, list[int], int]],
                 d_items: list[tuple[str, list[int], int]]) -> tuple[torch.Tensor | None, str | None]:
        """One forward pass over the prefill chunks and the decodes: the logits of each item's last
        token, prefills first; or why it failed."""
        try:
            logits = []
            if p_items:
                logits.append(forward_batch(self.model, self.kv, self.bm, p_items, self.device))
            if d_items:
                logits.append(forward_batch(self.model, self.kv, self.bm, d_items, self.device))
            return (logits[0] if len(logits) == 1 else torch.cat(logits)), None
        except Exception as e:
            log.exception("engine step failed")
            return None, f"engine step failed: {type(e).__name__}: {e}"

    def _step(self) -> None:
        outs: list[tuple[OutputCallback, TokenOutput]] = []
        if self.step_hook is not None:
            self._run_step_hook(self.step_hook, outs)
        with self._cond:
            self._idle_checked = False
            sched = self.scheduler.schedule()
            for seq in sched.too_long:
                self._finish(seq, "length", outs)
            for seq in sched.admitted:  # counted once per request, at its first admission
                self._prompt_tokens_total += len(seq.prompt_ids)
                if self.bm.prefix_caching:
                    self._prefix_queries_total += len(seq.prompt_ids)
                    self._prefix_hits_total += seq.num_cached_tokens
            prefills, decodes = list(sched.prefills), list(sched.decodes)
            p_items = [(s.request_id, s.all_ids()[s.num_computed:s.num_computed + s.num_scheduled], s.num_computed)
                       for s in prefills]
            d_items = [(s.request_id, [s.output_ids[-1] if s.output_ids else s.prompt_ids[-1]], s.num_tokens - 1)
                       for s in decodes]
        batch = prefills + decodes
        logits, error = self._forward(p_items, d_items) if batch else (None, None)
        with self._cond:
            if error is not None:
                for seq in batch:
                    if seq.request_id in self._seqs:
                        self._finish(seq, "error", outs, error=error)
            elif logits is not None:
                self._advance(batch, logits, outs)
            self._steps_total += 1
            self._check_invariant()
            self._cond.notify_all()
        self._dispatch(outs)

    def _advance(self, batch: list[Sequence], logits: torch.Tensor,
                 outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        """After a forward: every sequence's computed tokens move on (and its full blocks enter the
        prefix cache); those whose prompt is all computed sample a token. A sequence aborted while the
        forward ran is gone from ``_seqs`` and left alone."""
        sampling: list[int] = []
        for i, seq in enumerate(batch):
            if seq.request_id not in self._seqs:
                continue
            if seq.num_computed + seq.num_scheduled < seq.num_tokens:  # a prefill chunk short of the end
                seq.num_computed += seq.num_scheduled
                self._cache(seq)
            else:
                sampling.append(i)
        if not sampling:
            return
        chosen = [batch[i] for i in sampling]
        rows = logits if len(sampling) == len(batch) else logits[torch.tensor(sampling, device=logits.device)]
        for seq, tok in zip(chosen, self._sample(rows, chosen), strict=True):
            self._postprocess(seq, tok, outs)

    def _cache(self, seq: Sequence) -> None:
        bs = self.bm.block_size
        # only a step that filled a block has one to cache: skip the hashing and the call on most decodes
        if self.bm.prefix_caching and seq.num_computed // bs > (seq.num_computed - seq.num_scheduled) // bs:
            self.bm.cache_blocks(seq.request_id, seq.hashes(bs), seq.num_computed)

    def _postprocess(self, seq: Sequence, tok: int, outs: list[tuple[OutputCallback, TokenOutput]]) -> None:
        seq.num_computed = seq.num_tokens
        self._cache(seq)
        if not seq.output_ids and seq.first_scheduled is not None:
            now = time.monotonic()  # its first token: TTFT = queue (arrival to admission) + prefill
            self._queue_time = self._queue_time.observe(seq.first_scheduled - seq.arrival)
            self._prefill_time = self._prefill_time.observe(now - seq.first_scheduled)
        seq.output_ids.append(tok)
        if self._utf8 is not None:
            seq.utf8_state = self._utf8.next_state(seq.utf8_state, tok)
        self._generation_tokens_total += 1
        p = seq.params
        reason = None
        if (not p.ignore_eos and tok == self.tokenizer.eos_token_id) or tok in p.stop_token_ids:
            reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.config.max_model_len:
            reason = "length"
        if reason is not None:
            self._finish(seq, reason, outs, new_ids=(tok,))
        else:
            outs.append((seq.on_output, TokenOutput(seq.request_id, (tok,), False, None, len(seq.prompt_ids),
                                                    len(seq.output_ids), cached_tokens=seq.num_cached_tokens)))

    def _sample(self, logits: torch.Tensor, batch: list[Sequence]) -> list[int]:
        if self._utf8_bias is not None:
            states = torch.tensor([s.utf8_state for s in batch], dtype=torch.long, device=logits.device)
            logits = logits + self._utf8_bias[states]
        greedy: list[int] = logits.argmax(dim=-1).tolist()
        for i, seq in enumerate(batch):
            p = seq.params
            if p.temperature <= 0:
                continue
            probs = torch.softmax(logits[i].float() / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, idx = probs.sort(descending=True)
                cum = sp.cumsum(0)
                sp[(cum - sp) > p.top_p] = 0.0
                choice = torch.multinomial(sp, 1, generator=seq.generator)
                greedy[i] = int(idx[choice])
            else:
                greedy[i] = int(torch.multinomial(probs, 1, generator=seq.generator))
        return greedy


class AsyncEngine:
    """asyncio front-end: outputs cross from the engine thread via ``call_soon_threadsafe``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[TokenOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenOutput] = asyncio.Queue()

        def on_output(out: TokenOutput) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, out)
            except RuntimeError:  # loop closed: nobody is listening any more
                pass

        self.engine.add_request(request_id, prompt_token_ids, params, on_output)
        finished = False
        try:
            while True:
                out = await queue.get()
                if out.finished:
                    finished = True
                yield out
                if finished:
                    return
        finally:
            if not finished:
                self.engine.abort(request_id)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
