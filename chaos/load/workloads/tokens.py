"""Prompts of an exact token length in the target's own tokenizer, equal blocks for equal hash ids.

A Mooncake trace says how many prompt tokens each request has and which blocks of ``block_tokens``
(512) tokens it shares with other requests (equal ``hash_ids``). To make the engine's prefix cache
behave as it did in production, the prompt sent must be that many tokens *as the engine counts
them*, and two prompts whose first k hash ids are equal must begin with the same k * 512 tokens.

How: from the tokenizer's vocabulary keep the tokens that each stand for one lowercase ASCII word
with its leading space (``Ġthe`` in a byte-level BPE, ``▁the`` in a SentencePiece one) and that
encode back to themselves. A pre-tokenizer splits text at exactly those spaces, so any sequence of
them decodes to text that encodes back to the same ids, one per word: the token count is the number
of ids, and a shared id prefix is a shared text prefix. That is checked on random samples when the
maker is built, not assumed; a tokenizer where it does not hold (too few such words, fewer than
``MIN_WORDS``) gets approximate prompts like no tokenizer at all, and ``exact`` says which.

Each hash id maps, fixed by (seed, hash id), to a block of ``block_tokens`` such ids: chunks of 8
words from a table the seed draws, picked by the SHAKE-256 of the id (the same in every process);
a prompt is the concatenation of its blocks, cut to its input length. Without a tokenizer the same scheme
runs on characters: a block is ``4 * block_tokens`` characters of words (about 4 characters a token
in English BPE vocabularies), and the count returned is None.

Counts are of the prompt text alone: a chat template's role tokens and a BOS the server adds come
on top. Importing this module imports neither torch nor ``tokenizers`` (the light install has
neither); ``target_tokenizer`` imports ``tokenizers`` only when it finds a tokenizer to load.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import random
import re
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from chaos.model.experiment import TargetSpec

__all__ = ["HFTokenCounter", "PromptMaker", "TokenCounter", "builtin_tokenizer_path", "target_tokenizer",
           "tokenizer_file"]

CHARS_PER_TOKEN = 4  # the approximation without a tokenizer: English text in a BPE vocabulary
MIN_WORDS = 64  # fewer round-tripping word tokens than this: blocks would repeat too much to trust
MAX_WORDS = 4096  # enough for distinct blocks; stops the vocabulary scan early on 150K-token vocabularies
_CHECK_SAMPLES = 16  # random sequences encoded back when the maker is built
_CHECK_LENGTH = 512  # tokens in each
_MAX_DROPS = 64  # tokens dropped for failing in a sequence before the tokenizer is called inexact
_CACHE_BLOCKS = 2048  # blocks kept made (about 3 KB each); a trace with more distinct ids remakes them
CHUNK = 8  # words a chunk: a block is ceil(block_tokens / CHUNK) chunks of the seed's chunk table
CHUNKS = 1024  # the table's size; a power of two, so a 16-bit pick modulo it is unbiased
_WORD = re.compile(r" ?[a-z]{1,16}")

# the approximate mode's words: common, short, lowercase English (no tokenizer to count them with)
_APPROX_WORDS = tuple("""
the of and to in is it that for on with as was at by be this from or an are not have but had his
they you which one were all we her she there can been has their if will more when who no so what up
out about into than them only other new some could time these two may then do first any my now such
like our over man me even most made after also did many before must well back through years where
much your way down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three states himself few
house use during without again place around however home small found thought went say part once high
upon school every does got united left number course war until always away something fact water though
less public put think almost hand enough far took head yet government system better set told nothing
night end why called find going look asked later knew point next city give group toward young let room
""".split())


class TokenCounter(Protocol):
    """What the maker needs of a tokenizer (``HFTokenCounter``; the builtin engine's ``Tokenizer`` fits too)."""

    @property
    def vocab_size(self) -> int: ...  # ids 0 .. vocab_size - 1, added tokens included

    def encode(self, text: str) -> list[int]: ...  # no special tokens added

    def decode(self, ids: list[int]) -> str: ...


class HFTokenCounter:
    """A thin adapter over a Hugging Face ``tokenizers.Tokenizer``: ids without special tokens added."""

    def __init__(self, backend: Any, name: str = "") -> None:
        self._tok = backend
        self.name = name
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenCounter:
        """Load a ``tokenizer.json`` (needs the ``tokenizers`` package: the engine extra installs it)."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), name=str(path))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(list(ids), skip_special_tokens=True)
        return text


class PromptMaker:
    """Prompt texts of exact token lengths (``exact``) whose shared hash ids are shared token blocks.

    ``from_blocks`` and ``text_of_tokens`` return ``(text, count)``: count is the text's length in the
    tokenizer's tokens (the length asked for) when ``exact``, None when approximate. ``joins_exactly``
    says that texts made here may be concatenated and still count as the sum (true for byte-level
    BPE vocabularies such as the builtin one, GPT-2's, Llama 3's, Qwen's): join ``text_of_tokens``
    pieces only where it holds.
    """

    def __init__(self, tokenizer: TokenCounter | None, seed: int, block_tokens: int = 512) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be at least 1, found {block_tokens}")
        self.tokenizer = tokenizer
        self.seed = seed
        self.block_tokens = block_tokens
        self._words: list[int] = []
        self._pieces: dict[int, str] | None = None  # each word's own text, where texts concatenate
        self.why_inexact: str | None = "no tokenizer: prompts are about 4 characters a token"
        if tokenizer is not None:
            self._words, joins, self.why_inexact = _word_tokens(tokenizer)
            if joins:
                self._pieces = {w: tokenizer.decode([w]) for w in self._words}
        self.exact = self.why_inexact is None
        self.joins_exactly = self._pieces is not None
        # the chunk table, fixed by the seed: a block is ceil(block_tokens / CHUNK) chunks its key picks
        # (joining 64 chunk texts is ~9x cheaper than drawing and joining 512 words: a trace replayed at
        # 500 requests/s makes ~1,000 new blocks a second in the load's own process)
        rng = random.Random(f"streamchaos-chunks:{seed}")
        if self.exact:
            self._chunk_ids = [rng.choices(self._words, k=CHUNK) for _ in range(CHUNKS)]
            pieces = self._pieces
            self._chunk_text = ["".join(pieces[t] for t in c) for c in self._chunk_ids] if pieces else []
            self._picks = math.ceil(block_tokens / CHUNK)
        else:
            self._chunk_ids = []
            self._chunk_text = ["".join(" " + rng.choice(_APPROX_WORDS) for _ in range(CHUNK)) for _ in range(CHUNKS)]
            self._picks = math.ceil(block_tokens * CHARS_PER_TOKEN / min(map(len, self._chunk_text)))
        self._cache: OrderedDict[str, tuple[list[int], str]] = OrderedDict()

    def from_blocks(self, hash_ids: Sequence[int], input_length: int) -> tuple[str, int | None]:
        """The prompt of a trace request: its blocks by hash id, concatenated and cut to ``input_length``.

        ``hash_ids`` needs at least ceil(input_length / block_tokens) ids (the trace reader checks
        that a trace has exactly as many); ids past those are not used.
        """
        need = math.ceil(input_length / self.block_tokens) if input_length > 0 else 0
        if len(hash_ids) < need:
            raise ValueError(f"{len(hash_ids)} hash ids for {input_length} tokens: {need} needed "
                             f"(one per block of {self.block_tokens})")
        return self._text(input_length, [f"h{self.seed}:{h}" for h in hash_ids[:need]])

    def text_of_tokens(self, n: int, key: str) -> tuple[str, int | None]:
        """A text of ``n`` tokens fixed by (seed, key): the same key gives the same text, and a shorter
        ``n`` gives a token prefix of a longer one (blocks of ``block_tokens`` keyed by key and index).
        Keys live apart from hash ids: ``text_of_tokens`` never makes a trace block's text."""
        need = math.ceil(n / self.block_tokens) if n > 0 else 0
        return self._text(n, [f"k{self.seed}:{len(key)}:{key}:{j}" for j in range(need)])

    # -- the making ---------------------------------------------------------------------------------
    def _text(self, n: int, block_keys: list[str]) -> tuple[str, int | None]:
        if n <= 0:
            return "", (0 if self.exact else None)
        if not self.exact:
            text = "".join(self._block(k)[1] for k in block_keys)
            return text[: n * CHARS_PER_TOKEN], None
        full, rest = divmod(n, self.block_tokens)
        if self._pieces is not None:  # texts concatenate: each block's text made once, joined
            parts = [self._block(k)[1] for k in block_keys[:full]]
            if rest:
                parts.append(self._head_text(self._block(block_keys[full])[0], rest))
            return "".join(parts), n
        ids: list[int] = []
        for k in block_keys[:full]:
            ids += self._head_ids(self._block(k)[0], self.block_tokens)
        if rest:
            ids += self._head_ids(self._block(block_keys[full])[0], rest)
        assert self.tokenizer is not None  # exact implies a tokenizer
        return self.tokenizer.decode(ids), n

    def _block(self, key: str) -> tuple[list[int], str]:
        """(the chunks the key picks, the block's text: "" where texts are made by decoding ids)."""
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        # SHAKE-256 of the key: the same picks in every process, Python version and machine
        picks = array("H", hashlib.shake_256(f"streamchaos-prompt:{key}".encode()).digest(2 * self._picks))
        if sys.byteorder == "big":
            picks.byteswap()
        chosen = [p % CHUNKS for p in picks]
        if not self.exact:
            text = "".join(map(self._chunk_text.__getitem__, chosen))[: self.block_tokens * CHARS_PER_TOKEN]
        else:
            text = self._head_text(chosen, self.block_tokens) if self._pieces is not None else ""
        made = (chosen, text)
        self._cache[key] = made
        if len(self._cache) > _CACHE_BLOCKS:
            self._cache.popitem(last=False)
        return made

    def _head_text(self, chosen: list[int], m: int) -> str:
        """The text of a block's first ``m`` tokens (where texts concatenate)."""
        q, r = divmod(m, CHUNK)
        text = "".join(map(self._chunk_text.__getitem__, chosen[:q]))
        if r:
            assert self._pieces is not None
            text += "".join(self._pieces[t] for t in self._chunk_ids[chosen[q]][:r])
        return text

    def _head_ids(self, chosen: list[int], m: int) -> list[int]:
        """The token ids of a block's first ``m`` tokens."""
        return list(itertools.chain.from_iterable(self._chunk_ids[c] for c in chosen[: math.ceil(m / CHUNK)]))[:m]


def _word_tokens(tok: TokenCounter) -> tuple[list[int], bool, str | None]:
    """(word token ids, whether their texts concatenate, why the tokenizer cannot be exact or None)."""
    words, joins, why = _check_sequences(tok, _scan_vocabulary(tok))
    if why is None and len(words) < MIN_WORDS:
        why = (f"only {len(words)} of its tokens are whole lowercase words that encode back to themselves "
               f"({MIN_WORDS} needed): prompts are about 4 characters a token")
    return (words, joins, None) if why is None else ([], False, why)


def _scan_vocabulary(tok: TokenCounter) -> list[int]:
    """Ids that decode to one lowercase ASCII word carrying its own leading space and encode back."""
    words: list[int] = []
    for i in range(tok.vocab_size):
        try:
            piece = tok.decode([i])
        except Exception:  # an id a sparse vocabulary does not have
            continue
        if not _WORD.fullmatch(piece):
            continue
        word = piece.strip()
        # the token must carry its word's leading space itself: two of them decode with a space between
        pair = tok.decode([i, i])
        if pair in (f" {word} {word}", f"{word} {word}") and tok.encode(pair) == [i, i]:
            words.append(i)
            if len(words) >= MAX_WORDS:
                break
    return words


def _check_sequences(tok: TokenCounter, words: list[int]) -> tuple[list[int], bool, str | None]:
    """Random sequences must encode back too: a word failing in one is dropped (its neighbour too: either
    may be at fault). Also finds whether decoding is concatenating each token's own text (fast joins)."""
    rng = random.Random(0)
    drops, joins, checked = 0, True, 0
    while checked < _CHECK_SAMPLES and len(words) >= MIN_WORDS:
        ids = rng.choices(words, k=_CHECK_LENGTH)
        text = tok.decode(ids)
        back = tok.encode(text)
        if back == ids:
            joins = joins and text == "".join(tok.decode([t]) for t in ids)
            checked += 1
            continue
        at = next((j for j, (a, b) in enumerate(zip(ids, back, strict=False)) if a != b), min(len(ids), len(back)))
        bad = {ids[j] for j in (at - 1, at) if 0 <= j < len(ids)}
        words = [w for w in words if w not in bad]
        drops += len(bad)
        if drops > _MAX_DROPS:
            return [], False, (f"its word tokens do not encode back to themselves in sequence ({drops} dropped): "
                               "prompts are about 4 characters a token")
    return words, joins, None


def builtin_tokenizer_path() -> Path:
    """The builtin engine's tokenizer.json, found without importing the engine (which imports torch)."""
    import chaos

    return Path(chaos.__file__).resolve().parent / "stack" / "engine" / "data" / "tokenizer.json"


def tokenizer_file(target: TargetSpec) -> Path | None:
    """The tokenizer.json the target counts prompt tokens with, where this host has it; None otherwise. Found
    without loading it (the experiment's loader asks too: ``chaos.experiment.workload_section.tokenizer_of``).

    builtin (and a docker target running the builtin stack, no image): model ``tiny`` → the builtin
    tokenizer; a checkpoint directory → its tokenizer.json, or the builtin one where it has none (as
    the engine does). vllm: ``tiny`` → the builtin tokenizer (the exported model carries it); a local
    model directory with a tokenizer.json → that. A model vLLM downloads by name, a remote URL, or a
    host without the ``tokenizers`` package (the light install) → None: prompts are approximate.
    """
    import importlib.util

    if importlib.util.find_spec("tokenizers") is None:  # the light install: approximate prompts then
        return None
    kind = target.kind
    builtin_stack = kind == "builtin" or (kind == "docker" and target.image is None)
    if not builtin_stack and kind != "vllm":
        return None
    model = str(target.model)
    if model == "tiny":
        return builtin_tokenizer_path()
    if kind == "docker":  # a model path inside the container: not this host's to read
        return None
    directory = Path(os.path.expanduser(model))
    if not directory.is_dir():
        return None
    if (directory / "tokenizer.json").is_file():
        return directory / "tokenizer.json"
    return builtin_tokenizer_path() if builtin_stack else None


def target_tokenizer(target: TargetSpec) -> TokenCounter | None:
    """The tokenizer the target counts prompt tokens with (``tokenizer_file``), loaded; None where this host
    has none."""
    path = tokenizer_file(target)
    return HFTokenCounter.from_file(path) if path is not None else None
