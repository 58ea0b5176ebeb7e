"""Build the paged-attention inputs for one forward over a set of sequences and run it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .block_manager import BlockManager
from .kv_cache import KVCache
from .model import AttnMeta, CausalLM


def forward_batch(
    model: CausalLM,
    kv: KVCache,
    bm: BlockManager,
    items: Sequence[tuple[str, Sequence[int], int]],
    device: torch.device,
    all_logits: bool = False,
) -> torch.Tensor:
    """Compute ``items`` = [(seq_id, new_token_ids, start_position)], writing their K/V.

    Each sequence's blocks must already cover ``start + len(new_token_ids)`` tokens. Returns the
    logits of each sequence's last new token, [B, vocab] (or [B, T, vocab] with ``all_logits``).
    """
    B = len(items)
    bs = bm.block_size
    T = max(len(t) for _, t, _ in items)
    ids = [[0] * T for _ in range(B)]
    pos = [[0] * T for _ in range(B)]
    slots: list[int] = []
    valid: list[int] = []
    ctx: list[int] = []
    last: list[int] = []
    tables: list[list[int]] = []
    ragged = False
    for b, (sid, toks, start) in enumerate(items):
        n = len(toks)
        if n != T:
            ragged = True
        table = bm.tables[sid]
        ids[b][:n] = toks
        pos[b][:n] = range(start, start + n)
        for j in range(start, start + n):
            slots.append(table[j // bs] * bs + j % bs)
        valid.extend(range(b * T, b * T + n))
        ctx.append(start + n)
        last.append(n - 1)
        tables.append(table)
    max_blocks = max(-(-c // bs) for c in ctx)
    tables = [t[:max_blocks] + [0] * (max_blocks - min(len(t), max_blocks)) for t in tables]
    input_ids = torch.tensor(ids, dtype=torch.long, device=device)
    positions = torch.tensor(pos, dtype=torch.long, device=device)
    context = torch.tensor(ctx, dtype=torch.long, device=device)
    key_pos = torch.arange(max_blocks * bs, device=device)
    visible = (key_pos[None, None, :] <= positions[:, :, None]) & (key_pos[None, None, :] < context[:, None, None])
    # an additive mask, built once for every layer: SDPA would turn a boolean one into this at each layer
    # (measured: 40% of an 8K-token prefill's time on CPU went into that conversion)
    dtype = model.lm_head.weight.dtype
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))
    meta = AttnMeta(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        valid_index=torch.tensor(valid, dtype=torch.long, device=device) if ragged else None,
        block_tables=torch.tensor(tables, dtype=torch.long, device=device),
        mask=mask.unsqueeze(1),
    )
    logits_index = None if all_logits else torch.tensor(last, dtype=torch.long, device=device)
    with torch.inference_mode():
        return model(input_ids, positions, kv.layers(), meta, logits_index)
