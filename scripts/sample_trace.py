"""Writes experiments/traces/sample-mooncake.jsonl: a small seeded trace in the Mooncake layout.

About 200 requests over about 20 s (Poisson arrivals), prompts of 200-4,000 tokens, outputs of
16-256. Shaped like production traffic for a prefix cache: three apps each resend their own system
prompt (1, 2 and 4 blocks of 512 tokens, the same hash ids every time), some requests have no
system prompt, and about a third continue a conversation: the previous prompt, its answer and a
new user message, so the previous prompt's full blocks come back under the same hash ids.

    python scripts/sample_trace.py [--seed 42] [--out experiments/traces/sample-mooncake.jsonl]

tests/load/test_trace.py checks that the shipped file is what this writes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "traces" / "sample-mooncake.jsonl"
BLOCK = 512  # tokens a hash id stands for (Mooncake's block)


def mooncake_sample(seed: int = 42, requests: int = 200, duration_ms: int = 20_000) -> list[dict[str, Any]]:
    """The sample's requests as Mooncake records, in time order."""
    rng = random.Random(seed)
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    apps = [new_ids(blocks) for blocks in (1, 2, 4)]  # system prompts: 512, 1,024 and 2,048 tokens
    gaps = [rng.expovariate(1.0) for _ in range(requests)]
    scale = duration_ms * 0.98 / sum(gaps)  # Poisson arrivals, the last one just before duration_ms
    t = 0.0
    open_chats: list[tuple[int, int, list[int]]] = []  # (input_length, output_length, hash_ids) of a last turn
    out: list[dict[str, Any]] = []
    for gap in gaps:
        t += gap * scale
        output = int(min(256, max(16, rng.lognormvariate(4.2, 0.7))))
        prompt: tuple[int, list[int]] | None = None
        if open_chats and rng.random() < 0.35:  # a conversation's next turn
            last_in, last_out, last_ids = open_chats.pop(rng.randrange(len(open_chats)))
            length = last_in + last_out + rng.randint(30, 400)
            if length <= 4000:
                kept = last_ids[: last_in // BLOCK]  # the previous prompt's full blocks: the same tokens
                prompt = (length, kept + new_ids(-(-length // BLOCK) - len(kept)))
        if prompt is None:  # a new conversation, most under an app's system prompt
            system = rng.choice(apps) if rng.random() < 0.8 else []
            length = min(4000, max(200, len(system) * BLOCK + rng.randint(40, 1500)))
            prompt = (length, system + new_ids(-(-length // BLOCK) - len(system)))
        length, ids = prompt
        out.append({"timestamp": int(t), "input_length": length, "output_length": output, "hash_ids": ids})
        open_chats.append((length, output, ids))
        if len(open_chats) > 12:  # users leave: old conversations end
            open_chats.pop(0)
    return out


def render(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records = mooncake_sample(seed=args.seed)
    args.out.write_text(render(records), encoding="utf-8")
    print(f"{args.out}: {len(records)} requests over {records[-1]['timestamp'] / 1000:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
