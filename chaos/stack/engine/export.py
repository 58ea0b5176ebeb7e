"""Write the builtin ``tiny`` model as a Hugging Face Llama checkpoint directory.

Other engines (``transformers serve``, vLLM, llama.cpp after conversion) can then serve the very
model the builtin stack serves, from a local directory, with nothing downloaded: config.json
(``LlamaForCausalLM``), model.safetensors (our parameter names are Hugging Face's, see
``model.load_hf``), the builtin tokenizer (tokenizer.json + tokenizer_config.json with its special
tokens and a chat template) and generation_config.json (greedy).

The weights are the seeded ``tiny`` model's but for one hidden channel and the ``lm_head`` rows of
byte-fragment tokens (fragment_guard.py): they rank every token whose decode alone is not whole
characters at least ``MARGIN_LOGITS`` below every other, for any input, so any engine's text is
valid UTF-8 with any sampling and no decoding constraint (vLLM ignores generation_config's
``suppress_tokens``; the builtin engine masks them itself only for ``tiny``). The tokenizer is
untouched: every prompt still encodes, fragments included. The certified margin is in the
safetensors metadata (``fragment_margin_logits``).

    python -m chaos.stack.engine.export DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from .fragment_guard import fragment_ids, guard, margin_bound
from .model import ModelConfig, build_tiny
from .tokenizer import DEFAULT_TOKENIZER, Tokenizer

__all__ = ["CHAT_TEMPLATE", "export_tiny", "guarded_tiny"]

# the builtin chat format (tokenizer.apply_chat_template), as a Jinja template transformers can run
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def guarded_tiny(seed: int = 0) -> tuple[Tokenizer, ModelConfig, dict[str, torch.Tensor], float]:
    """The builtin tokenizer, the seeded ``tiny`` model's config, its fragment-guarded weights (Hugging
    Face names) and their certified margin: what every export writes."""
    tok = Tokenizer.load(None)
    model = build_tiny(tok.vocab_size, seed=seed)
    cfg = model.config
    fragments = fragment_ids(tok)
    state = guard({name: p.detach() for name, p in model.named_parameters()}, cfg, fragments)
    return tok, cfg, state, margin_bound(state, cfg, fragments)


def export_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write the seeded ``tiny`` model to ``directory`` (created); return it."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok, cfg, state, margin = guarded_tiny(seed)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt", "fragment_margin_logits": f"{margin:.1f}"})
    bos, eos, pad = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>"), tok.token_to_id("<|pad|>")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.dim_head, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": False}, indent=2),
        encoding="utf-8")
    shutil.copyfile(DEFAULT_TOKENIZER, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "add_bos_token": False, "model_max_length": cfg.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.stack.engine.export", description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's seed (the stack's --seed)")
    args = parser.parse_args(argv)
    print(export_tiny(args.directory, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
