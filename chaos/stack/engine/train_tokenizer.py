"""Regenerate ``data/tokenizer.json`` from ``data/corpus.txt`` (deterministic).

    python -m chaos.stack.engine.train_tokenizer        # rewrites data/tokenizer.json

Byte-level BPE (GPT-2 style byte alphabet), so every string round-trips and rarer multibyte
characters (CJK, emoji) stay split across several tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
VOCAB_SIZE = 3072
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]


def train(corpus: Path = DATA / "corpus.txt", out: Path = DATA / "tokenizer.json") -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus.read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    out.write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    path = train()
    print(f"wrote {path}", file=sys.stderr)
