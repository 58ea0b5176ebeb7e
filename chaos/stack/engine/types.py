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
