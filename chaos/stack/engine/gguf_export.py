"""Write the builtin ``tiny`` model as a GGUF file that llama.cpp's ``llama-server`` serves.

The same seeded, fragment-guarded weights as ``export.py`` writes for Hugging Face engines (so every
token llama.cpp can sample decodes to whole characters: its text stays valid UTF-8 under any
sampling), in llama.cpp's own layout, written with llama.cpp's own ``gguf`` package (the copy its
sources carry, ``gguf-py``, or the ``gguf`` distribution; ``--gguf-py DIR`` names the former):

- architecture ``llama``, float32 tensors under llama.cpp's names (``token_embd``, ``blk.N.attn_q``, ...);
- Q and K rows permuted from Hugging Face's rotate-half rotary layout to llama.cpp's interleaved one
  (what llama.cpp's ``convert_hf_to_gguf.py`` does for every Llama checkpoint);
- the builtin byte-level BPE tokenizer as a ``gpt2`` vocabulary with the ``gpt-2`` pre-tokenizer
  (ours is GPT-2's ByteLevel split: ``use_regex``, no prefix space). llama.cpp maps a byte it has no
  merge for to the token of that byte's printable stand-in and aborts on a missing one, so all 256
  byte tokens must be in the vocabulary: ``export_gguf`` checks that they are;
- the special tokens as control tokens, ``<|eos|>`` as end of generation, no BOS added to prompts
  (the builtin engine adds none), and the builtin chat template.

    python -m chaos.stack.engine.gguf_export OUT.gguf [--seed N] [--gguf-py DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .export import CHAT_TEMPLATE, guarded_tiny
from .tokenizer import DEFAULT_TOKENIZER

__all__ = ["export_gguf", "hf_to_gguf_name", "permute_rotary"]

ARCH = "llama"

# Hugging Face parameter names (model.py) → llama.cpp's tensor names (gguf-py's tensor_mapping)
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def hf_to_gguf_name(name: str) -> str:
    """llama.cpp's name for one of the tiny model's parameters (KeyError for one it has no place for). Pure."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    prefix, _, rest = name.partition(".layers.")
    if prefix != "model" or not rest:
        raise KeyError(name)
    index, _, leaf = rest.partition(".")
    return f"blk.{int(index)}.{_LAYER_NAMES[leaf]}"


def permute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Q or K rows from Hugging Face's rotate-half pairing (i, i + d/2) to llama.cpp's adjacent pairs
    (2i, 2i + 1), per head; ``heads`` is the number of heads the rows hold (K: the KV heads). Pure."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _load_gguf(gguf_py: str | Path | None) -> ModuleType:
    if gguf_py is not None:
        sys.path.insert(0, str(gguf_py))
    try:
        return importlib.import_module("gguf")
    except ImportError as exc:
        raise SystemExit(f"cannot import llama.cpp's gguf package ({exc}): pass --gguf-py with the gguf-py "
                         "folder of llama.cpp's sources, or install the gguf distribution") from exc


def _vocabulary(gguf: ModuleType) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """Tokens by id, their llama.cpp types, the merges ("a b") and the special tokens' ids."""
    spec: dict[str, Any] = json.loads(DEFAULT_TOKENIZER.read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    special = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special")}
    vocab.update(special)
    size = max(vocab.values()) + 1
    tokens = [""] * size
    for text, i in vocab.items():
        tokens[i] = text
    missing_ids = [i for i, t in enumerate(tokens) if not t]
    if missing_ids:
        raise SystemExit(f"the builtin tokenizer has no token for ids {missing_ids[:8]}: no dense vocabulary")
    from tokenizers.pre_tokenizers import ByteLevel

    missing_bytes = [c for c in ByteLevel.alphabet() if c not in vocab]
    if missing_bytes:  # llama.cpp would abort on the first such byte in a prompt
        raise SystemExit(f"the builtin tokenizer lacks {len(missing_bytes)} of the 256 byte tokens llama.cpp needs")
    kinds = gguf.TokenType
    types = [int(kinds.CONTROL) if t in special else int(kinds.NORMAL) for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges, special


def export_gguf(path: str | Path, seed: int = 0, gguf_py: str | Path | None = None) -> Path:
    """Write the seeded ``tiny`` model to ``path`` as GGUF (float32); return the path."""
    gguf = _load_gguf(gguf_py)
    tok, cfg, state, margin = guarded_tiny(seed)
    tokens, types, merges, special = _vocabulary(gguf)
    if len(tokens) != cfg.vocab_size:
        raise SystemExit(f"the vocabulary has {len(tokens)} tokens but the model {cfg.vocab_size} rows")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), ARCH)
    writer.add_name(f"streamchaos-tiny-seed{seed}")
    writer.add_description(f"streamchaos builtin tiny model, seed {seed}, fragment margin {margin:.1f} logits")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.dim_head)
    writer.add_value_length(cfg.dim_head)
    writer.add_rope_dimension_count(cfg.dim_head)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special["<|bos|>"])
    writer.add_eos_token_id(special["<|eos|>"])
    writer.add_eot_token_id(special["<|eos|>"])
    writer.add_pad_token_id(special["<|pad|>"])
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in state.items():
        data = tensor.detach().to("cpu").float().numpy().astype(np.float32)
        if name.endswith("self_attn.q_proj.weight"):
            data = permute_rotary(data, cfg.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            data = permute_rotary(data, cfg.num_key_value_heads)
        writer.add_tensor(hf_to_gguf_name(name), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.stack.engine.gguf_export",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("path", help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's seed (the stack's --seed)")
    parser.add_argument("--gguf-py", help="llama.cpp's gguf-py folder (else the installed gguf package)")
    args = parser.parse_args(argv)
    print(export_gguf(args.path, args.seed, args.gguf_py))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
