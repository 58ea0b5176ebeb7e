"""The builtin inference engine: tokenizer, Llama-style model, paged KV cache, continuous batching.

Importing this package starts no thread and builds no model; ``Engine(config)`` does the work.
"""

from .block_manager import BlockManager
from .detokenizer import IncrementalDetokenizer
from .engine import AsyncEngine, Engine, resolve_device
from .tokenizer import Tokenizer
from .types import (
    DuplicateRequest,
    EngineConfig,
    EngineError,
    EngineSetupFailed,
    EngineStats,
    EngineStopped,
    InvalidRequest,
    PromptTooLong,
    SamplingParams,
    TokenOutput,
)

__all__ = [
    "AsyncEngine",
    "BlockManager",
    "DuplicateRequest",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineSetupFailed",
    "EngineStats",
    "EngineStopped",
    "IncrementalDetokenizer",
    "InvalidRequest",
    "PromptTooLong",
    "SamplingParams",
    "TokenOutput",
    "Tokenizer",
    "resolve_device",
]
