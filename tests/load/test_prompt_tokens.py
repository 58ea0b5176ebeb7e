"""Prompts of exact token lengths in the target's tokenizer: equal hash ids make equal token blocks.

Counted with the builtin engine's own tokenizer (the one its server counts prompt tokens with), by
encoding the text made back, never by trusting the maker's count.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from chaos.load.workloads.tokens import (
    CHARS_PER_TOKEN,
    HFTokenCounter,
    PromptMaker,
    builtin_tokenizer_path,
    target_tokenizer,
)
from chaos.model.experiment import TargetSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend() -> Tokenizer:
    return Tokenizer.from_file(str(builtin_tokenizer_path()))


@pytest.fixture(scope="module")
def maker() -> PromptMaker:
    tok = target_tokenizer(TargetSpec())
    assert tok is not None
    return PromptMaker(tok, seed=11)


def _counts(backend: Tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]


def _lengths() -> list[int]:
    """Every length up to 1,100 (each remainder of a 512-token block, across two block edges), each
    block edge to 8,192 and one either side, and seeded lengths between."""
    edges = [k * 512 + d for k in range(2, 17) for d in (-1, 0, 1)]
    rng = random.Random(3)
    return sorted({*range(1, 1101), *edges, *(rng.randint(1101, 8192) for _ in range(40))} - {8193})


def test_a_prompt_is_exactly_its_input_length_in_the_builtin_tokenizer(maker: PromptMaker, backend: Tokenizer) -> None:
    assert maker.exact and maker.why_inexact is None and maker.joins_exactly
    hash_ids = list(range(100, 116))
    lengths = _lengths()
    made = [maker.from_blocks(hash_ids, n) for n in lengths]
    assert [count for _, count in made] == lengths
    assert _counts(backend, [text for text, _ in made]) == lengths
    text_8k, _ = made[-1]
    assert lengths[-1] == 8192 and text_8k.isascii() and len(text_8k) > 8192


def test_requests_sharing_hash_ids_share_those_blocks_token_for_token(maker: PromptMaker, backend: Tokenizer) -> None:
    a, _ = maker.from_blocks([7, 8, 9], 1500)
    b, _ = maker.from_blocks([7, 8, 21, 22], 1800)
    c, _ = maker.from_blocks([7], 300)  # a partial first block: a prefix of the full one
    d, _ = maker.from_blocks([8, 7, 9], 1500)  # the same blocks in another order: no shared prefix
    ta, tb, tc, td = (backend.encode(t, add_special_tokens=False).ids for t in (a, b, c, d))
    assert ta[:1024] == tb[:1024] and ta[1024:1500] != tb[1024:1500]
    assert tc == ta[:300]
    assert td[:512] == ta[512:1024] and td[:512] != ta[:512]
    shared, _ = maker.from_blocks([7, 8], 1024)  # the texts share a prefix too: the shared blocks' text
    assert a.startswith(shared) and b.startswith(shared) and a.startswith(c)


@pytest.mark.parametrize("block_tokens", [1, 64, 100])
def test_other_block_sizes_are_exact_and_share_their_blocks(backend: Tokenizer, block_tokens: int) -> None:
    made = PromptMaker(target_tokenizer(TargetSpec()), seed=4, block_tokens=block_tokens)
    lengths = [1, 7, block_tokens, block_tokens + 1, 3 * block_tokens - 1, 700]
    ids = list(range(1000))
    assert _counts(backend, [made.from_blocks(ids, n)[0] for n in lengths]) == lengths
    a, b = (backend.encode(made.from_blocks(h, 5 * block_tokens)[0], add_special_tokens=False).ids
            for h in ([9, 8, 7, 6, 5], [9, 8, 7, 1, 2]))
    assert a[: 3 * block_tokens] == b[: 3 * block_tokens] and a[3 * block_tokens:] != b[3 * block_tokens:]


def test_prompts_count_exactly_inside_the_engine_chat_template_too(maker: PromptMaker) -> None:
    """The server counts prompt tokens on the rendered chat: the template's tokens plus exactly the text's."""
    engine = pytest.importorskip("chaos.stack.engine.tokenizer")  # imports torch (the engine extra)
    tok = engine.Tokenizer.load()
    frame = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": ""}])))
    for n in (1, 37, 511, 512, 513, 2000, 4096):
        text, _ = maker.from_blocks([1, 2, 3, 4, 5, 6, 7, 8], n)
        assert len(tok.encode(text)) == n
        assert len(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))) == frame + n


def test_prompts_are_fixed_by_the_seed(maker: PromptMaker) -> None:
    tok = target_tokenizer(TargetSpec())
    again = PromptMaker(tok, seed=11)
    other = PromptMaker(tok, seed=12)
    assert again.from_blocks([5, 6], 900) == maker.from_blocks([5, 6], 900)
    assert other.from_blocks([5, 6], 900) != maker.from_blocks([5, 6], 900)
    assert maker.from_blocks([5], 400) != maker.from_blocks([6], 400)
    assert again.text_of_tokens(700, "k") == maker.text_of_tokens(700, "k") != other.text_of_tokens(700, "k")


def test_prompts_are_the_same_in_another_process_whatever_its_hash_seed(maker: PromptMaker) -> None:
    """Load workers are separate processes: a block must not depend on Python's per-process str hash."""
    code = ("from chaos.load.workloads.tokens import PromptMaker, target_tokenizer\n"
            "from chaos.model.experiment import TargetSpec\n"
            "import sys\n"
            "m = PromptMaker(target_tokenizer(TargetSpec()), seed=11)\n"
            "sys.stdout.write(m.from_blocks([3, 1, 4], 1400)[0] + '|' + m.text_of_tokens(300, 'x')[0])\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == maker.from_blocks([3, 1, 4], 1400)[0] + "|" + maker.text_of_tokens(300, "x")[0]


def test_text_of_tokens_is_exact_prefix_consistent_and_joins(maker: PromptMaker, backend: Tokenizer) -> None:
    texts = {n: maker.text_of_tokens(n, "system-prompt")[0] for n in (1, 100, 512, 513, 3000)}
    assert _counts(backend, list(texts.values())) == list(texts)
    ids = backend.encode(texts[3000], add_special_tokens=False).ids
    for n, text in texts.items():
        assert backend.encode(text, add_special_tokens=False).ids == ids[:n]
    # a prefix and a suffix made apart count as their sum when joined (joins_exactly)
    joined = maker.text_of_tokens(700, "prefix-0")[0] + maker.text_of_tokens(45, "suffix-3")[0]
    assert _counts(backend, [joined]) == [745]
    # keys live apart from hash ids
    assert maker.text_of_tokens(512, "1")[0] != maker.from_blocks([1], 512)[0]
    assert maker.text_of_tokens(0, "k") == ("", 0) == maker.from_blocks([], 0)


def test_too_few_hash_ids_is_a_caller_error(maker: PromptMaker) -> None:
    with pytest.raises(ValueError, match="2 needed"):
        maker.from_blocks([1], 513)
    assert maker.from_blocks([1, 2, 3], 513) == maker.from_blocks([1, 2], 513)  # ids past the needed unused


def test_without_a_tokenizer_prompts_are_approximate_and_still_share_prefixes() -> None:
    plain = PromptMaker(None, seed=11)
    assert not plain.exact and not plain.joins_exactly and "no tokenizer" in (plain.why_inexact or "")
    a, count = plain.from_blocks([7, 8, 9], 1500)
    b, _ = plain.from_blocks([7, 8, 21], 1500)
    assert count is None and len(a) == 1500 * CHARS_PER_TOKEN and a.isascii()
    assert a[: 1024 * CHARS_PER_TOKEN] == b[: 1024 * CHARS_PER_TOKEN] and a != b
    assert plain.from_blocks([7, 8, 9], 1500) == PromptMaker(None, seed=11).from_blocks([7, 8, 9], 1500)
    assert plain.text_of_tokens(10, "k") == (plain.text_of_tokens(20, "k")[0][:40], None)
    assert plain.text_of_tokens(0, "k") == ("", None)


@pytest.mark.parametrize("kind", ["sentencepiece-style BPE", "WordPiece"])
def test_tokenizers_whose_texts_do_not_concatenate_are_exact_by_decoding(kind: str) -> None:
    """A Metaspace ("▁the") or WordPiece vocabulary: the decoder, not concatenation, makes the text."""
    lines = (ROOT / "chaos" / "stack" / "engine" / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()
    if kind == "WordPiece":
        trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trained.pre_tokenizer = pre_tokenizers.Whitespace()
        trained.decoder = decoders.WordPiece()
        trainer: trainers.Trainer = trainers.WordPieceTrainer(vocab_size=3000, special_tokens=["[UNK]"],
                                                              show_progress=False)  # 1,500: too few whole words
    else:
        trained = Tokenizer(models.BPE())
        trained.pre_tokenizer = pre_tokenizers.Metaspace()
        trained.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False)
    trained.train_from_iterator(lines, trainer)
    made = PromptMaker(HFTokenCounter(trained), seed=2)
    assert made.exact and not made.joins_exactly
    lengths = [1, 2, 7, 511, 512, 513, 1500, 2049]
    texts = [made.from_blocks([4, 5, 6, 7, 8], n)[0] for n in lengths]
    assert _counts(trained, texts) == lengths
    a, b = (trained.encode(made.from_blocks(ids, 1500)[0], add_special_tokens=False).ids
            for ids in ([1, 2, 3], [1, 2, 9]))
    assert a[:1024] == b[:1024] and a[1024:] != b[1024:]


def test_a_tokenizer_without_enough_round_tripping_words_makes_approximate_prompts() -> None:
    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate(["the", "cat", "sat", "on", "a", "mat"], 1)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    few = PromptMaker(HFTokenCounter(word_level), seed=1)
    assert not few.exact and "only 6 of its tokens" in (few.why_inexact or "")
    assert few.from_blocks([1], 10)[1] is None


def test_target_tokenizer_finds_the_targets_own(tmp_path: Path) -> None:
    builtin = target_tokenizer(TargetSpec())
    assert builtin is not None and builtin.vocab_size == Tokenizer.from_file(str(builtin_tokenizer_path())) \
        .get_vocab_size(with_added_tokens=True)
    assert target_tokenizer(TargetSpec(kind="vllm", model="tiny")) is not None  # its export carries the builtin one
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert target_tokenizer(TargetSpec(kind="vllm", model=str(model_dir))) is None  # no tokenizer.json
    assert target_tokenizer(TargetSpec(kind="builtin", model=str(model_dir))) is not None  # the engine's fallback
    shutil.copyfile(builtin_tokenizer_path(), model_dir / "tokenizer.json")
    assert target_tokenizer(TargetSpec(kind="vllm", model=str(model_dir))) is not None
    assert target_tokenizer(TargetSpec(kind="vllm", model="Qwen/Qwen3-0.6B")) is None  # a hub name: not here
    assert target_tokenizer(TargetSpec(kind="openai", url="http://127.0.0.1:9/v1", model="tiny")) is None
    assert target_tokenizer(TargetSpec(kind="docker", image="vllm/vllm-openai", model="tiny")) is None


def test_the_prompt_library_imports_no_torch() -> None:
    """The light install has no torch: reading traces and finding the builtin tokenizer must not need it."""
    code = ("import sys\n"
            "from chaos.load.workloads.tokens import PromptMaker, target_tokenizer\n"
            "from chaos.load.workloads.trace import read_mooncake\n"
            "from chaos.model.experiment import TargetSpec\n"
            "from pathlib import Path\n"
            "m = PromptMaker(target_tokenizer(TargetSpec()), seed=1)\n"
            "r = read_mooncake(Path('experiments/traces/sample-mooncake.jsonl'))\n"
            "assert m.exact and m.from_blocks(r[0].hash_ids, r[0].input_length)[1] == r[0].input_length\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60, check=True)
