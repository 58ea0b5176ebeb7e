"""Public data types of the engine (shared with the server)."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.model.errors import ChaosError, SetupFailed


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"  # "tiny" or a path to an HF checkpoint dir
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    kv_blocks: int = 512
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 1024
    seed: int = 0
    dtype: str = "float32"  # float32 on CPU; bfloat16/float16 allowed on CUDA
    num_threads: int | None = None  # CPU intra-op threads; None = the measured best default
    prefix_caching: bool = True  # automatic prefix caching of full KV blocks (vLLM's default: on)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class TokenOutput:
    """One engine step's result for one request."""

    request_id: str
    token_ids: tuple[int, ...]  # new tokens this step (empty on a pure finish/error)
    finished: bool
    finish_reason: str | None  # stop | length | abort | error
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)


# vLLM's ``request_latency`` bucket family (vllm/v1/metrics/buckets.py): queue and prefill times, seconds
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                        480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative observations in fixed buckets: ``counts[i]`` fell at or under ``bounds[i]`` and above
    the bound before (the last count: above every bound). Seconds."""

    bounds: tuple[float, ...] = REQUEST_TIME_BUCKETS
    counts: tuple[int, ...] = (0,) * (len(REQUEST_TIME_BUCKETS) + 1)
    sum: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> Histogram:
        i = next((k for k, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        counts = list(self.counts)
        counts[i] += 1
        return Histogram(self.bounds, tuple(counts), self.sum + value)


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int  # includes reserved blocks
    kv_blocks_total: int
    kv_blocks_reserved: int
    num_preemptions: int
    leaks_total: int
    leaked_request_ids: tuple[str, ...]
    prompt_tokens_total: int
    generation_tokens_total: int
    steps_total: int
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache (first admissions)
    prefix_cache_hits_total: int = 0  # of those, tokens served from it
    kv_blocks_cached: int = 0  # free blocks still holding a cached prefix (evictable; not in kv_blocks_used)
    prefix_caching: bool = False
    queue_time: Histogram = Histogram()  # arrival to first admission, per request with a first token
    prefill_time: Histogram = Histogram()  # first admission to first token


class EngineError(ChaosError):
    """Root of the engine's own errors."""


class InvalidRequest(EngineError, ValueError):
    """The request cannot be served as given (server: HTTP 400)."""


class PromptTooLong(InvalidRequest):
    """The prompt does not fit in ``max_model_len`` (or in the whole KV pool)."""


class DuplicateRequest(InvalidRequest):
    """A live request already has this id."""


class EngineStopped(EngineError, RuntimeError):
    """The engine is shut down (or not started) and takes no requests."""


class EngineSetupFailed(SetupFailed):
    """The engine could not be built (bad model path, device, dtype)."""
