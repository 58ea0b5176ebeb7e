from __future__ import annotations

import json
import shutil

from chaos.stack.engine import Tokenizer
from chaos.stack.engine.tokenizer import DEFAULT_TOKENIZER
from chaos.stack.engine.train_tokenizer import DATA, train


def test_builtin_roundtrip_and_specials():
    tok = Tokenizer.load()
    assert 2048 <= tok.vocab_size <= 4096
    assert tok.bos_token_id is not None and tok.eos_token_id is not None
    text = "Hello, world! def f(x): return x 今天天气很好 🚀 서울 こんにちは 龘 🦄"
    assert tok.decode(tok.encode(text)) == text


def test_multibyte_characters_span_tokens():
    tok = Tokenizer.load()
    for ch in ("龘", "🦄", "𝄞"):
        ids = tok.encode(ch)
        assert len(ids) >= 2, (ch, ids)
        # each piece alone is not valid text
        assert "\ufffd" in tok.decode(ids[:1])
        assert tok.decode(ids) == ch


def test_chat_template_uses_role_tokens():
    tok = Tokenizer.load()
    text = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id
    for role in ("<|system|>", "<|user|>", "<|assistant|>"):
        assert tok.token_to_id(role) in ids
    assert ids.count(tok.eos_token_id) == 2


def test_training_is_deterministic(tmp_path):
    out = train(DATA / "corpus.txt", tmp_path / "tokenizer.json")
    assert out.read_text(encoding="utf-8") == DEFAULT_TOKENIZER.read_text(encoding="utf-8")


def test_hf_dir_loads_through_same_class(tmp_path):
    shutil.copy(DEFAULT_TOKENIZER, tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>", "bos_token": "<|bos|>"}))
    tok = Tokenizer.load(tmp_path)
    assert tok.eos_token_id == Tokenizer.load().eos_token_id
    assert tok.decode(tok.encode("héllo 世界")) == "héllo 世界"
