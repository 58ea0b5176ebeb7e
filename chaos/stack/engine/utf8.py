"""A UTF-8 validity constraint for the random-weight ``tiny`` model.

Random weights happily emit a continuation byte after ASCII, which decodes to U+FFFD. Real models
(almost) never do, and the stack's verifiers ("no U+FFFD in streamed text") need that property.
So for ``tiny`` the sampler masks the tokens that would make the byte stream invalid UTF-8, given a
small DFA state per sequence. Multibyte characters still split across tokens (a lead-byte token
may be followed by continuation-byte tokens); they just always complete, except when the request
is cut by ``max_tokens`` mid-character, as with any real model.
"""

from __future__ import annotations

import torch

from .tokenizer import Tokenizer

ACCEPT, ERR = 0, -1
NUM_STATES = 8


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _step(state: int, b: int) -> int:
    if state == ACCEPT:
        if b < 0x80:
            return ACCEPT
        if 0xC2 <= b <= 0xDF:
            return 1
        if b == 0xE0:
            return 4
        if b == 0xED:
            return 5
        if 0xE1 <= b <= 0xEF:
            return 2
        if b == 0xF0:
            return 6
        if 0xF1 <= b <= 0xF3:
            return 3
        if b == 0xF4:
            return 7
        return ERR
    lo, hi, nxt = {1: (0x80, 0xBF, 0), 2: (0x80, 0xBF, 1), 3: (0x80, 0xBF, 2), 4: (0xA0, 0xBF, 1),
                   5: (0x80, 0x9F, 1), 6: (0x90, 0xBF, 2), 7: (0x80, 0x8F, 2)}[state]
    return nxt if lo <= b <= hi else ERR


class Utf8Constraint:
    """``bias[state]`` is a [vocab] additive mask; ``next_state(state, token)`` advances the DFA."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        dec = {c: b for b, c in _bytes_to_unicode().items()}
        specials = set()
        backend = tokenizer._tok
        for tid in range(vocab_size):
            tok = backend.id_to_token(tid)
            if tok is None or tok.startswith("<|"):
                specials.add(tid)
        self.table: list[list[int]] = [[ERR] * vocab_size for _ in range(NUM_STATES)]
        for tid in range(vocab_size):
            tok = backend.id_to_token(tid)
            if tid in specials:
                self.table[ACCEPT][tid] = ACCEPT if tok is not None else ERR
                continue
            if tok is None:
                continue
            try:
                data = bytes(dec[c] for c in tok)
            except KeyError:
                continue
            for s in range(NUM_STATES):
                st = s
                for b in data:
                    st = _step(st, b)
                    if st == ERR:
                        break
                self.table[s][tid] = st
        allowed = torch.tensor(self.table) != ERR
        self.bias = torch.where(allowed, 0.0, float("-inf"))  # [states, vocab]

    def next_state(self, state: int, token_id: int) -> int:
        st = self.table[state][token_id] if 0 <= token_id < len(self.table[0]) else ERR
        return ACCEPT if st == ERR else st
