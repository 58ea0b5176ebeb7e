"""The exported tiny checkpoint keeps byte-fragment tokens out of any engine's output by its weights alone.

Each engine here honours no decoding constraint: transformers' ``generate`` with a generation
config of our own (no ``suppress_tokens``), and the builtin engine loading the directory (it masks
fragments only for ``tiny``). Fragments are found with transformers' own tokenizer, not ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from chaos.stack.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from chaos.stack.engine.export import export_tiny  # noqa: E402
from chaos.stack.engine.fragment_guard import MARGIN_LOGITS, guard, margin_bound  # noqa: E402
from chaos.stack.engine.model import ModelConfig, build_tiny, tiny_config  # noqa: E402

pytestmark = pytest.mark.timeout(300)

PROMPTS = ["Hello world", "今天天气很好，我们去公园", "🚀 launch the rocket 🌕😀", "서버는 안정적",
           "Ünïcödé façade — naïve"]
NEW_TOKENS = 200


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny(tmp_path_factory.mktemp("export") / "tiny")


@pytest.fixture(scope="module")
def hf(checkpoint: Path) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase, set[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    fragments = {i for i in range(len(tok)) if "\ufffd" in tok.decode([i], skip_special_tokens=False)}
    assert 0 < len(fragments) < len(tok)
    return model, tok, fragments


def test_generation_config_does_not_suppress(checkpoint: Path) -> None:
    assert "suppress_tokens" not in json.loads((checkpoint / "generation_config.json").read_text())


@pytest.mark.parametrize("mode", ["sample", "sample-eos", "greedy"])
def test_transformers_generate_emits_no_fragment(hf, mode: str) -> None:
    model, tok, fragments = hf
    # our own config, nothing from the checkpoint's: min_new_tokens masks EOS as ignore_eos does
    sample = mode != "greedy"
    config = transformers.GenerationConfig(
        do_sample=sample, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
        min_new_tokens=0 if mode == "sample-eos" else NEW_TOKENS, num_return_sequences=2 if sample else 1,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.generation_config = config
    tok.padding_side = "left"
    batch = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    for row, prompt in zip(batch.input_ids.tolist(), PROMPTS, strict=True):
        assert tok.decode(row, skip_special_tokens=True) == prompt  # the tokenizer still encodes any prompt
    generated = 0
    for seed in (1, 2) if sample else (0,):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(**batch, generation_config=config)
        for i, row in enumerate(out[:, batch.input_ids.shape[1]:].tolist()):
            new = row[:row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row
            generated += len(new)
            prompt = PROMPTS[i // config.num_return_sequences]
            emitted = sorted(set(new) & fragments)
            assert not emitted, (seed, prompt, emitted[:10])
            assert "\ufffd" not in tok.decode(new, skip_special_tokens=False), (seed, prompt)
    if mode != "sample-eos":
        assert generated == NEW_TOKENS * len(PROMPTS) * (4 if sample else 1)


def test_certified_margin_holds_on_real_logits(checkpoint: Path, hf) -> None:
    """The bound in the metadata is the weights' own, reaches MARGIN_LOGITS, and no input beats it."""
    model, tok, fragments = hf
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        stated = float(f.metadata()["fragment_margin_logits"])
    cfg = ModelConfig.from_hf(json.loads((checkpoint / "config.json").read_text()))
    state = load_file(str(checkpoint / "model.safetensors"))
    bound = margin_bound(state, cfg, sorted(fragments))
    assert bound >= MARGIN_LOGITS and abs(bound - stated) < 0.1
    frag = torch.zeros(len(tok), dtype=torch.bool)
    frag[sorted(fragments)] = True
    g = torch.Generator().manual_seed(7)
    worst, positions = float("inf"), 0
    for n in (1, 2, 17, 64, 256):  # random ids over the whole vocabulary, fragments and specials included
        ids = torch.randint(0, len(tok), (8, n), generator=g)
        with torch.no_grad():
            logits = model(ids).logits.double()
        gap = logits[..., ~frag].min(-1).values - logits[..., frag].max(-1).values
        worst, positions = min(worst, float(gap.min())), positions + gap.numel()
    print(f"certified {bound:.1f} logits; lowest measured over {positions:,} positions {worst:.1f}")
    assert worst >= bound


def test_export_changes_only_the_guard(checkpoint: Path, hf) -> None:
    """One channel and the fragment rows' lm_head weight at it; every other weight is the seeded tiny model's."""
    _, tok, fragments = hf
    state = load_file(str(checkpoint / "model.safetensors"))
    tiny = {k: v.detach() for k, v in build_tiny(len(tok), seed=0).named_parameters()}
    assert state.keys() == tiny.keys()
    frag = sorted(fragments)
    assert bool((state["model.embed_tokens.weight"][:, 0] > 0).all())
    assert float(state["model.embed_tokens.weight"][:, 0].std()) == 0.0
    head = state["lm_head.weight"][:, 0]
    allowed = torch.ones(len(tok), dtype=torch.bool)
    allowed[frag] = False
    assert bool((head[allowed] == 0).all()) and bool((head[frag] < 0).all())
    for name, w in state.items():
        keep = torch.ones_like(w, dtype=torch.bool)
        if w.dim() == 2 and ("embed_tokens" in name or "lm_head" in name or name.endswith(
                ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"))):
            keep[:, 0] = False
            assert "embed_tokens" in name or "lm_head" in name or not bool(w[:, 0].any()), name
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            keep[0] = False
            assert not bool(w[0].any()), name
        torch.testing.assert_close(w[keep], tiny[name][keep], rtol=0, atol=0, msg=name)


def test_builtin_engine_serves_the_export_as_valid_utf8(checkpoint: Path, hf, run_all) -> None:
    _, _, fragments = hf
    eng = Engine(EngineConfig(model=str(checkpoint), device="cpu", max_model_len=512))
    eng.start()
    try:
        reqs = [(f"r{i}", eng.tokenizer.encode(p), SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i,
                                                                  ignore_eos=True))
                for i, p in enumerate(PROMPTS)]
        col = run_all(eng, reqs, timeout=120.0)
        for rid, _, _ in reqs:
            ids = col.tokens(rid)
            assert len(ids) == NEW_TOKENS
            assert not set(ids) & fragments, rid
            assert "\ufffd" not in eng.tokenizer.decode(ids, skip_special_tokens=False), rid
    finally:
        eng.shutdown()


def test_the_guard_certifies_only_guarded_weights(hf) -> None:
    """The seeded tiny model certifies nothing; a guarded copy reaches any margin asked; tied weights are refused."""
    _, tok, fragments = hf
    frag = sorted(fragments)
    model = build_tiny(len(tok), seed=3)
    state = {k: v.detach() for k, v in model.named_parameters()}
    assert margin_bound(state, model.config, frag) == float("-inf")
    assert margin_bound(guard(state, model.config, frag, margin_logits=50.0), model.config, frag) >= 50.0
    assert margin_bound(state, model.config, frag) == float("-inf")  # the input is left as it was
    tied = tiny_config(len(tok))
    tied.tie_word_embeddings = True
    with pytest.raises(ValueError, match="untied lm_head"):
        guard(state, tied, frag)
