"""Write the builtin ``tiny`` model as a Hugging Face Llama checkpoint directory.

Other engines (``transformers serve``, vLLM, llama.cpp after conversion) can then serve the very
model the builtin stack serves, from a local directory, with nothing downloaded: config.json
(``LlamaForCausalLM``), model.safetensors (our parameter names are Hugging Face's, see
``model.load_hf``), the builtin tokenizer (tokenizer.json + tokenizer_config.json with its special
tokens and a chat template) and generation_config.json (greedy; byte-fragment tokens suppressed).

    python -m chaos.stack.engine.export DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from .model import build_tiny
from .tokenizer import DEFAULT_TOKENIZER, Tokenizer

__all__ = ["export_tiny"]

# the builtin chat format (tokenizer.apply_chat_template), as a Jinja template transformers can run
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def export_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write the seeded ``tiny`` model to ``directory`` (created); return it."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.load(None)
    model = build_tiny(tok.vocab_size, seed=seed)
    cfg = model.config
    state = {name: p.detach().contiguous().clone() for name, p in model.named_parameters()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
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
    # Random weights wander over byte-fragment tokens; the builtin engine keeps its output valid UTF-8
    # with a decoding constraint, which other engines lack. Suppressing every token that is not whole
    # characters by itself keeps their text free of U+FFFD too (integrity judges the server, not the
    # random model).
    fragments = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i], skip_special_tokens=False)]
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": False,
         "suppress_tokens": fragments}, indent=2), encoding="utf-8")
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
