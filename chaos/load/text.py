"""Seeded synthetic text of one script (ASCII words, CJK ideographs, emoji sequences): what prompts,
user messages and shared prefixes are made of where no file or tokenizer gives them. Pure of its
``random.Random``. Its own module so the workload kinds (chaos.load.workloads) and the single-turn
workload (chaos.load.workload) both use it without importing each other.
"""

from __future__ import annotations

import random

from chaos.model.errors import ExperimentInvalid

__all__ = ["SCRIPTS", "synthetic_text"]

SCRIPTS = ("ascii", "cjk", "emoji")

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her all she there would their we him been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first any "
    "my now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take three stream "
    "token cache kernel latency server client request batch decode prefill model engine queue"
).split()
# common CJK unified ideographs (3 bytes each in UTF-8) plus fullwidth punctuation
_CJK_RANGE = (0x4E00, 0x9FA5)
_CJK_PUNCT = "，。、！？"
_EMOJI = (
    "😀", "😂", "🥲", "🤖", "🚀", "🔥", "✨", "🎉", "🧠", "💾", "⚡", "🌍", "🍕", "🐍", "❤️",
    "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "👋🏽", "🧑🏿‍💻",  # skin tone modifiers
    "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🚀", "👁️‍🗨️", "❤️‍🔥", "🐻‍❄️",  # ZWJ sequences
    "🇯🇵", "🇺🇦", "1️⃣",  # flags and keycaps
)


def synthetic_text(rng: random.Random, chars: int, script: str) -> str:
    """About ``chars`` code points of one script; never cuts an emoji sequence in the middle."""
    if script not in SCRIPTS:
        raise ExperimentInvalid(f"load.prompts.mix: unknown script {script!r}; use one of {', '.join(SCRIPTS)}")
    parts: list[str] = []
    size = 0
    while size < chars:
        if script == "ascii":
            piece = rng.choice(_WORDS) + " "
        elif script == "cjk":
            piece = rng.choice(_CJK_PUNCT) if rng.random() < 0.08 else chr(rng.randint(*_CJK_RANGE))
        else:
            piece = rng.choice(_EMOJI)
        parts.append(piece)
        size += len(piece)
    text = "".join(parts)
    if script == "ascii":
        return text[:chars]  # ASCII can be cut anywhere
    return text  # emoji sequences stay whole, so this may run a few code points over
