"""A Llama-style decoder (Llama / Qwen2 family) with paged-KV attention.

RMSNorm, rotary embeddings (rotate-half convention, as in HF), SwiGLU gated MLP, grouped-query
attention, tied or untied ``lm_head``. Parameter names follow Hugging Face so that a checkpoint's
``state_dict`` loads as is.

Attention always goes through the paged KV cache: the new tokens' K/V are written into their
slots first, then each sequence's whole context is gathered through its block table and attended
with a mask (``key_pos <= query_pos`` and ``key_pos < context_len``). Prefill and decode share it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chaos.model.errors import SetupFailed


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False  # Llama's attention_bias also covers o_proj; Qwen2's does not
    model_type: str = "llama"

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        mt = d.get("model_type", "llama")
        if mt not in ("llama", "qwen2", "mistral"):
            raise SetupFailed(f"unsupported model_type {mt!r} (llama, qwen2, mistral are supported)")
        if d.get("hidden_act", "silu") != "silu":
            raise SetupFailed(f"unsupported hidden_act {d.get('hidden_act')!r}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type not in ("default", None):
            raise SetupFailed(f"unsupported rope scaling {rope_type!r} (only default rotary is implemented)")
        theta = d.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
        if mt == "qwen2":
            qkv_bias, o_bias = True, False
        else:
            qkv_bias = o_bias = bool(d.get("attention_bias", False))
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim"),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=o_bias,
            model_type=mt,
        )


class RMSNorm(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.dim_head
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, cfg.hidden_size, bias=cfg.o_proj_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        B, T, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.num_heads, hd)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, hd)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, hd)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        # write the new K/V into their cache slots
        kf = k.reshape(B * T, self.num_kv_heads, hd)
        vf = v.reshape(B * T, self.num_kv_heads, hd)
        if meta.valid_index is not None:
            kf = kf.index_select(0, meta.valid_index)
            vf = vf.index_select(0, meta.valid_index)
        nb, bs = k_cache.shape[0], k_cache.shape[1]
        k_cache.view(nb * bs, self.num_kv_heads, hd).index_copy_(0, meta.slot_mapping, kf.to(k_cache.dtype))
        v_cache.view(nb * bs, self.num_kv_heads, hd).index_copy_(0, meta.slot_mapping, vf.to(v_cache.dtype))
        # gather each sequence's context through its block table
        S = meta.block_tables.shape[1] * bs
        K = k_cache[meta.block_tables].view(B, S, self.num_kv_heads, hd).transpose(1, 2)
        V = v_cache[meta.block_tables].view(B, S, self.num_kv_heads, hd).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), K, V, attn_mask=meta.mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * hd))


class MLP(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class AttnMeta:
    """Per-forward attention metadata, shared by all layers."""

    slot_mapping: torch.Tensor  # [N] flat cache slot for each valid new token
    valid_index: torch.Tensor | None  # [N] index into the flattened [B*T] tokens (None: all valid)
    block_tables: torch.Tensor  # [B, max_blocks]
    mask: torch.Tensor  # [B, 1, T, S] additive (0 = attend, -inf = not) or bool (True = attend)


class Backbone(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):  # type: ignore[misc]  # nn.Module is Any: mypy does not follow torch (pyproject.toml)
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope_len = 0
        self.rope_cos: torch.Tensor = torch.empty(0)
        self.rope_sin: torch.Tensor = torch.empty(0)

    def _rope(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if n > self._rope_len or self.rope_cos.device != device or self.rope_cos.dtype != self.lm_head.weight.dtype:
            n = max(n, self.config.max_position_embeddings, 64)
            hd = self.config.dim_head
            inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
            t = torch.arange(n, dtype=torch.int64).float()
            freqs = torch.outer(t, inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            dtype = self.lm_head.weight.dtype
            self.rope_cos = emb.cos().to(device=device, dtype=dtype)
            self.rope_sin = emb.sin().to(device=device, dtype=dtype)
            self._rope_len = n
        return self.rope_cos, self.rope_sin

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttnMeta,
        logits_index: torch.Tensor | None = None,  # [B]: which T position to project (None: all)
    ) -> torch.Tensor:
        cos_t, sin_t = self._rope(int(positions.max().item()) + 1 if positions.numel() else 1, input_ids.device)
        cos = cos_t[positions].unsqueeze(2)  # [B, T, 1, hd]
        sin = sin_t[positions].unsqueeze(2)
        x = self.model.embed_tokens(input_ids)
        layer: DecoderLayer
        for layer, (kc, vc) in zip(self.model.layers, kv_caches, strict=True):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, kc, vc, meta)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if logits_index is not None:
            x = x[torch.arange(x.shape[0], device=x.device), logits_index]  # [B, D]
        return self.lm_head(self.model.norm(x)).float()


TINY_LAYERS = 2


def tiny_config(vocab_size: int) -> ModelConfig:
    """The builtin ``tiny`` model: small enough for thousands of tokens/s on a 2-core CPU."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=8192,  # 8K contexts; the export says so, or vLLM caps --max-model-len here
        tie_word_embeddings=False,
    )


def build_tiny(vocab_size: int, seed: int = 0, cfg: ModelConfig | None = None) -> CausalLM:
    """Seeded random weights, scaled so that greedy decoding wanders over the vocabulary.

    Embeddings ~ N(0, 1); projections ~ N(0, 1/fan_in) (activations keep their scale through the
    residual stream); an untied lm_head with a larger gain so logits are peaked, not flat.
    """
    cfg = cfg or tiny_config(vocab_size)
    g = torch.Generator().manual_seed(seed)
    model = CausalLM(cfg)  # plain CPU init is cheap here (meta-device init costs ~1 s on first use)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("layernorm.weight", "norm.weight")):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=g)
            elif name == "lm_head.weight":
                p.normal_(0.0, 3.0 / math.sqrt(cfg.hidden_size), generator=g)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=g)
    model._rope_len = 0
    model.eval()  # returns the model itself, typed Any here: torch is not followed
    return model


def load_hf(path: str | Path) -> CausalLM:
    """Load a local Hugging Face checkpoint directory (config.json + *.safetensors)."""
    from safetensors.torch import load_file

    p = Path(path)
    cj = p / "config.json"
    if not cj.is_file():
        raise SetupFailed(f"{p}: no config.json (expected a Hugging Face checkpoint directory)")
    cfg = ModelConfig.from_hf(json.loads(cj.read_text(encoding="utf-8")))
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise SetupFailed(f"{p}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    with torch.device("meta"):
        meta = CausalLM(cfg)
    model: CausalLM = meta.to_empty(device="cpu")
    own = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing = [k for k in own if k not in state and not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing:
        raise SetupFailed(f"{p}: checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
    with torch.no_grad():
        for k, t in state.items():
            if k in own:
                if own[k].shape != t.shape:
                    raise SetupFailed(f"{p}: {k} has shape {tuple(t.shape)}, expected {tuple(own[k].shape)}")
                own[k].copy_(t.to(torch.float32))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model._rope_len = 0
    model.eval()  # returns the model itself, typed Any here: torch is not followed
    return model


__all__ = ["AttnMeta", "CausalLM", "ModelConfig", "build_tiny", "load_hf", "tiny_config"]
