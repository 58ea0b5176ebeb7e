"""Byte-level BPE tokenizer shipped with the package, plus HF ``tokenizer.json`` loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TOKENIZER = DATA_DIR / "tokenizer.json"

BOS = "<|bos|>"
EOS = "<|eos|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}


class Tokenizer:
    """Thin wrapper over ``tokenizers.Tokenizer`` with the few things the engine needs."""

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        bos_token: str | None = BOS,
        eos_token: str | None = EOS,
        name: str = "builtin",
    ) -> None:
        self._tok = backend
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id: int | None = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id: int | None = backend.token_to_id(eos_token) if eos_token else None
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self._native_roles = all(backend.token_to_id(t) is not None for t in ROLE_TOKENS.values())
        self.max_token_bytes = max_token_bytes(backend)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Tokenizer:
        """Load the builtin tokenizer (``path=None``), a ``tokenizer.json`` file, or an HF model dir."""
        if path is None:
            return cls(_HFTokenizer.from_file(str(DEFAULT_TOKENIZER)))
        p = Path(path)
        if p.is_dir():
            tj = p / "tokenizer.json"
            if not tj.is_file():
                raise FileNotFoundError(f"{p} has no tokenizer.json")
            backend = _HFTokenizer.from_file(str(tj))
            bos, eos = _special_tokens_from_dir(p, backend)
            return cls(backend, bos_token=bos, eos_token=eos, name=p.name)
        backend = _HFTokenizer.from_file(str(p))
        bos = BOS if backend.token_to_id(BOS) is not None else None
        eos = EOS if backend.token_to_id(EOS) is not None else None
        return cls(backend, bos_token=bos, eos_token=eos, name=p.stem)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int] | tuple[int, ...], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render messages as text (encode the result with ``encode``; special tokens are parsed).

        Builtin format: ``<|bos|><|user|>\\nHello<|eos|>\\n<|assistant|>\\n``. For foreign tokenizers
        without the role tokens a plain ``role: content`` transcript is produced.
        """
        parts: list[str] = []
        if self._native_roles:
            if self.bos_token:
                parts.append(self.bos_token)
            for m in messages:
                role = str(m.get("role", "user"))
                tag = ROLE_TOKENS.get(role)
                if tag is None:
                    raise ValueError(f"unknown chat role {role!r}")
                parts.append(f"{tag}\n{_content_text(m.get('content'))}{self.eos_token}\n")
            if add_generation_prompt:
                parts.append(f"{ROLE_TOKENS['assistant']}\n")
            return "".join(parts)
        for m in messages:
            parts.append(f"{m.get('role', 'user')}: {_content_text(m.get('content'))}\n")
        if add_generation_prompt:
            parts.append("assistant:")
        return "".join(parts)


def max_token_bytes(backend: _HFTokenizer) -> int | None:
    """The most bytes of UTF-8 text one token of ``backend`` can stand for, or None where no bound holds.

    Why: a prompt longer than this many bytes per token of the context cannot fit, and saying so
    before ``encode`` spares the server's loop the tokenization (which holds the GIL: 0.7-1.4 s for a
    900 KB prompt, the loop stalled throughout). Holds for a BPE model that never fuses unknown text
    into one token: a byte-level vocabulary stands for one byte per character of a token (67 for the
    builtin one), any other for at most the token's own UTF-8 length (``▁`` and ``<0x41>`` stand for
    fewer), an added token for its content. A normalizer may shrink text before the model sees it
    (NFC composes three Hangul jamo into one syllable): three times the bound then. None for WordPiece,
    Unigram, or a BPE that fuses unknown characters (one token for any run of them).
    """
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or (model.get("unk_token") is not None and model.get("fuse_unk")):
        return None
    byte_level = '"ByteLevel"' in json.dumps(spec.get("pre_tokenizer"))
    vocab = backend.get_vocab(with_added_tokens=False)
    longest = max((len(t) if byte_level else len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1)
    for added in spec.get("added_tokens") or []:
        longest = max(longest, len(str(added.get("content", "")).encode("utf-8", "surrogatepass")))
    longest = max(longest, 4)  # an unknown character on its own: at most 4 bytes
    return longest * (3 if spec.get("normalizer") else 1)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _special_tokens_from_dir(p: Path, backend: _HFTokenizer) -> tuple[str | None, str | None]:
    bos = eos = None
    tc = p / "tokenizer_config.json"
    if tc.is_file():
        cfg = json.loads(tc.read_text(encoding="utf-8"))
        bos, eos = _tok_str(cfg.get("bos_token")), _tok_str(cfg.get("eos_token"))
    if eos is None or bos is None:
        by_key = _special_tokens_by_id(p / "config.json", backend)
        bos = by_key.get("bos_token_id") if bos is None else bos
        eos = by_key.get("eos_token_id") if eos is None else eos
    if bos is None and backend.token_to_id(BOS) is not None:
        bos = BOS
    if eos is None and backend.token_to_id(EOS) is not None:
        eos = EOS
    return bos, eos


def _special_tokens_by_id(cj: Path, backend: _HFTokenizer) -> dict[str, str | None]:
    """The model config's ``bos_token_id`` / ``eos_token_id`` (the first of a list) as tokens, by key."""
    found: dict[str, str | None] = {}
    if not cj.is_file():
        return found
    cfg = json.loads(cj.read_text(encoding="utf-8"))
    for key in ("bos_token_id", "eos_token_id"):
        tid = cfg.get(key)
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if isinstance(tid, int):
            found[key] = backend.id_to_token(tid)
    return found


def _tok_str(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    content = v.get("content") if isinstance(v, dict) else None
    return content if isinstance(content, str) else None
