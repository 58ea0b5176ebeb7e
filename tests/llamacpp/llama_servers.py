"""What the llama.cpp tier's fixture hands its tests (a module of its own: ``conftest`` names clash across folders)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LlamaServer:
    url: str  # the server's root (its OpenAI root is url + "/v1")
    log: Path
    flags: tuple[str, ...]
