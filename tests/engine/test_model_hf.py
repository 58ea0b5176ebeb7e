"""Our Llama/Qwen2 implementation (through the paged KV cache) == transformers' logits."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from chaos.stack.engine.block_manager import BlockManager
from chaos.stack.engine.forward import forward_batch
from chaos.stack.engine.kv_cache import KVCache
from chaos.stack.engine.model import load_hf

CPU = torch.device("cpu")


def _tiny_hf(kind: str, path):
    torch.manual_seed(0)
    common: dict = {"vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                    "rms_norm_eps": 1e-5}
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=500000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)  # non-zero biases too, so the q/k/v bias mapping is checked
    model.eval()
    model.save_pretrained(path)
    return model


def _cache(model, blocks=32, bs=4):
    c = model.config
    return KVCache(c.num_hidden_layers, blocks, bs, c.num_key_value_heads, c.dim_head, torch.float32, CPU), \
        BlockManager(blocks, bs)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_logits_match_transformers(kind, tmp_path):
    ref = _tiny_hf(kind, tmp_path)
    ours = load_hf(tmp_path)
    if kind == "qwen2":
        assert ours.config.attention_bias and ours.config.tie_word_embeddings
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 160, (11,), generator=g).tolist()
    b = torch.randint(0, 160, (6,), generator=g).tolist()
    with torch.no_grad():
        ref_a = ref(torch.tensor([a])).logits[0].float()
        ref_b = ref(torch.tensor([b])).logits[0].float()

    # prefill: every position's logits, two ragged sequences in one padded batch
    kv, bm = _cache(ours)
    bm.allocate("a", len(a))
    bm.allocate("b", len(b))
    got = forward_batch(ours, kv, bm, [("a", a, 0), ("b", b, 0)], CPU, all_logits=True)
    torch.testing.assert_close(got[0, : len(a)], ref_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1, : len(b)], ref_b, atol=1e-4, rtol=1e-4)

    # paged decode: prefill all but the last token, then decode it (both sequences batched)
    kv, bm = _cache(ours)
    bm.allocate("a", len(a))
    bm.allocate("b", len(b))
    forward_batch(ours, kv, bm, [("a", a[:-1], 0), ("b", b[:-1], 0)], CPU)
    got = forward_batch(ours, kv, bm, [("a", a[-1:], len(a) - 1), ("b", b[-1:], len(b) - 1)], CPU)
    torch.testing.assert_close(got[0], ref_a[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], ref_b[-1], atol=1e-4, rtol=1e-4)


def test_engine_runs_hf_checkpoint(tmp_path, run_all):
    import shutil

    from chaos.model.errors import SetupFailed
    from chaos.stack.engine import Engine, EngineConfig, SamplingParams
    from chaos.stack.engine.tokenizer import DEFAULT_TOKENIZER

    # no tokenizer.json and a smaller vocab than the builtin tokenizer: a clear setup error
    _tiny_hf("llama", tmp_path)
    with pytest.raises(SetupFailed):
        Engine(EngineConfig(model=str(tmp_path), device="cpu"))

    # a checkpoint with its own tokenizer.json
    _tiny_hf_vocab = transformers.LlamaConfig(vocab_size=3072, hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    d = tmp_path / "withtok"
    transformers.LlamaForCausalLM(_tiny_hf_vocab).save_pretrained(d)
    shutil.copy(DEFAULT_TOKENIZER, d / "tokenizer.json")
    eng = Engine(EngineConfig(model=str(d), device="cpu", kv_blocks=32, block_size=4, max_model_len=64))
    eng.start()
    try:
        col = run_all(eng, [("x", eng.tokenizer.encode("hello"), SamplingParams(max_tokens=5, ignore_eos=True))])
        assert col.final("x").finish_reason == "length" and len(col.tokens("x")) == 5
    finally:
        eng.shutdown()
