"""Keep byte-fragment tokens out of a Llama checkpoint's output through its weights alone.

A byte-fragment token is one whose bytes alone are not whole UTF-8 characters (a lone continuation
byte, half of a CJK character): emitted, it decodes to U+FFFD. Random weights wander over them. The
builtin engine masks them while sampling (utf8.py); an engine serving an exported checkpoint may
honour no such mask (vLLM ignores generation_config's ``suppress_tokens``), so the weights themselves
must rank every fragment below every other token, for any input.

The construction reserves one hidden channel ``c`` of the residual stream as a constant:

- every token embedding holds ``bias`` (> 0) at ``c``;
- every layer's input projections (q/k/v, gate/up) have a zero column at ``c``: it influences nothing;
- every layer's output projections (o_proj, down_proj) have a zero row at ``c``: nothing writes to it;

so the final residual is ``x[c] = bias`` at every position, and after the final RMSNorm
``h[c] = g[c] * bias / rms(x) > 0``. The untied ``lm_head`` rows of fragment tokens get a large
negative weight at ``c`` (every other row 0 there). The residual's other channels are bounded whatever
the input (each block reads an RMS-normalised vector, so its output is bounded by its weights'
norms), which bounds how far the rest of ``lm_head`` can lift a fragment: ``margin_bound`` turns that
into a certified lower bound on (lowest non-fragment logit - highest fragment logit) over all inputs,
and ``guard`` picks the weight that makes the bound ``margin_logits``. With 200 logits a fragment's
probability is exactly 0 in float32 (exp underflows below -104) up to temperature 1.9: no sampler
can draw one, and masking other tokens (``ignore_eos``, stop tokens) leaves every fragment still
below every token that remains. The bound is loose (it allows for a worst case no input reaches), so
the real gap is far wider (the tiny export: 200 certified, over 16,000 measured); every weight stays
within float16's range, so a half-precision engine loads them finite.

Pure functions of a ``state_dict`` (Hugging Face names) and its ``ModelConfig``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .model import ModelConfig
from .tokenizer import Tokenizer

__all__ = ["MARGIN_LOGITS", "fragment_ids", "guard", "margin_bound", "residual_bound"]

MARGIN_LOGITS = 200.0  # certified gap below every non-fragment token
FLOAT16_MAX = 65504.0
BIAS_CHANNEL = 0
BIAS_VALUE = 1.0  # the constant channel's value: an embedding coordinate's scale (they are ~N(0, 1))
READS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
WRITES = ("self_attn.o_proj", "mlp.down_proj")


def fragment_ids(tokenizer: Tokenizer) -> list[int]:
    """The tokens whose decode alone is not whole characters (it holds U+FFFD)."""
    return [i for i in range(tokenizer.vocab_size) if "\ufffd" in tokenizer.decode([i], skip_special_tokens=False)]


def _rest(n: int, channel: int) -> torch.Tensor:
    return torch.tensor([i for i in range(n) if i != channel], dtype=torch.long)


def _spectral(w: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(w.double(), ord=2))


def _check(state: Mapping[str, torch.Tensor], cfg: ModelConfig, channel: int) -> None:
    if cfg.tie_word_embeddings or "lm_head.weight" not in state:
        raise ValueError("the fragment guard needs an untied lm_head")
    if cfg.attention_bias or cfg.o_proj_bias:
        raise ValueError("the fragment guard's bound assumes projections without bias")
    for i in range(cfg.num_hidden_layers):
        for name in READS:
            if bool(state[f"model.layers.{i}.{name}.weight"][:, channel].any()):
                raise ValueError(f"layer {i} {name} reads channel {channel}")
        for name in WRITES:
            if bool(state[f"model.layers.{i}.{name}.weight"][channel].any()):
                raise ValueError(f"layer {i} {name} writes channel {channel}")


def residual_bound(state: Mapping[str, torch.Tensor], cfg: ModelConfig, channel: int = BIAS_CHANNEL) -> float:
    """An upper bound on the L2 norm of the final residual without ``channel``, for any tokens and length.

    Each block reads ``g * x / rms(x)``, whose norm is at most ``max|g| * sqrt(D)``. Attention's output
    is ``o_proj`` of per-head convex combinations of values; the MLP's is ``down(silu(G n) * U n)``
    with ``|silu(z)| <= |z|``, so ``|| . || <= ||down|| * max_row||G|| * ||U|| * ||n||^2``.
    """
    d = cfg.hidden_size
    rest = _rest(d, channel)
    hd, groups = cfg.dim_head, cfg.num_attention_heads // cfg.num_key_value_heads
    bound = float(state["model.embed_tokens.weight"][:, rest].double().norm(dim=1).max())
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        n_attn = float(state[p + "input_layernorm.weight"][rest].abs().max()) * math.sqrt(d)
        wv = state[p + "self_attn.v_proj.weight"]
        heads_sq = sum(groups * _spectral(wv[k * hd:(k + 1) * hd]) ** 2 for k in range(cfg.num_key_value_heads))
        bound += _spectral(state[p + "self_attn.o_proj.weight"]) * math.sqrt(heads_sq) * n_attn
        n_mlp = float(state[p + "post_attention_layernorm.weight"][rest].abs().max()) * math.sqrt(d)
        gate_row = float(state[p + "mlp.gate_proj.weight"].double().norm(dim=1).max())
        bound += (_spectral(state[p + "mlp.down_proj.weight"]) * gate_row * _spectral(state[p + "mlp.up_proj.weight"])
                  * n_mlp**2)
    return bound


@dataclass(frozen=True)
class _Terms:
    bias: float  # the constant channel's value in every embedding
    gain: float  # the final RMSNorm's weight at the channel
    lift: float  # max |lm_head row without the channel| of a non-fragment + of a fragment (norm-scaled)
    push: float  # lowest non-fragment - highest fragment lm_head weight at the channel
    x_rest: float  # residual_bound
    dim: int
    eps: float

    def rms(self, x_rest: float) -> float:
        return math.sqrt((self.bias**2 + x_rest**2) / self.dim + self.eps)


def _terms(state: Mapping[str, torch.Tensor], cfg: ModelConfig, fragments: Sequence[int], channel: int) -> _Terms:
    rest = _rest(cfg.hidden_size, channel)
    frag = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    frag[list(fragments)] = True
    head = state["lm_head.weight"].double()
    g = state["model.norm.weight"].double()
    scaled = head[:, rest] * g[rest]
    return _Terms(
        bias=float(state["model.embed_tokens.weight"][:, channel].min()), gain=float(g[channel]),
        lift=float(scaled[~frag].norm(dim=1).max()) + float(scaled[frag].norm(dim=1).max()),
        push=float(head[~frag, channel].min()) - float(head[frag, channel].max()),
        x_rest=residual_bound(state, cfg, channel), dim=cfg.hidden_size, eps=cfg.rms_norm_eps)


def margin_bound(state: Mapping[str, torch.Tensor], cfg: ModelConfig, fragments: Sequence[int],
                 channel: int = BIAS_CHANNEL) -> float:
    """A lower bound, over every input, on (lowest non-fragment logit - highest fragment logit).

    ``-inf`` when the weights certify nothing (a checkpoint without the guard). For a token's logit
    ``w . (g * x) / rms(x)``, the difference is ``(gain * bias * push + rest) / rms(x)`` with
    ``|rest| <= lift * x_rest`` and ``rms(x)`` between ``rms(0)`` and ``rms(x_rest)``.
    """
    try:
        _check(state, cfg, channel)
    except ValueError:
        return -math.inf
    emb = state["model.embed_tokens.weight"][:, channel]
    t = _terms(state, cfg, fragments, channel)
    if t.bias <= 0 or float(emb.max()) != t.bias or t.gain <= 0:
        return -math.inf
    numerator = t.gain * t.bias * t.push - t.lift * t.x_rest
    return numerator / (t.rms(t.x_rest) if numerator > 0 else t.rms(0.0))


def guard(state: Mapping[str, torch.Tensor], cfg: ModelConfig, fragments: Sequence[int], *,
          channel: int = BIAS_CHANNEL, bias: float = BIAS_VALUE,
          margin_logits: float = MARGIN_LOGITS) -> dict[str, torch.Tensor]:
    """A copy of ``state`` whose ``fragments`` sit at least ``margin_logits`` below every other token."""
    out = {k: v.detach().clone() for k, v in state.items()}
    with torch.no_grad():
        out["model.embed_tokens.weight"][:, channel] = bias
        for i in range(cfg.num_hidden_layers):
            for name in READS:
                out[f"model.layers.{i}.{name}.weight"][:, channel] = 0.0
            for name in WRITES:
                out[f"model.layers.{i}.{name}.weight"][channel] = 0.0
        head = out["lm_head.weight"]
        head[:, channel] = 0.0
        _check(out, cfg, channel)
        t = _terms(out, cfg, fragments, channel)
        # solve margin_bound == margin_logits for the fragment rows' weight; a hair over for float32 rounding
        push = (margin_logits * t.rms(t.x_rest) + t.lift * t.x_rest) / (t.gain * t.bias)
        head[list(fragments), channel] = -push * 1.0001
    if float(head.abs().max()) >= FLOAT16_MAX:
        raise ValueError(f"the fragment guard needs a weight of {push:.0f}, beyond float16's range")
    if not margin_bound(out, cfg, fragments, channel) >= margin_logits:
        raise ValueError(f"the fragment guard reached {margin_bound(out, cfg, fragments, channel):.1f} logits, "
                         f"not {margin_logits:g}")
    return out
