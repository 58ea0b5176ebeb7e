"""The builtin stack with a slow tail of first tokens: 3% of streams wait 1.5 s before their first event.

    python tests/e2e/planted_tail.py [--share 0.03] [--wait 1.5] [stack serve flags]

The other 97% stream as the builtin stack does, so a p50 or p75 TTFT budget passes; only a check of the
tail (the shipped smoke's ``ttft_tail``, p99) can catch it. The slow streams are spread evenly (stream i
is slow when floor(i x share) steps up), not drawn at random, so every run has exactly its share.
The defect lives here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path

from starlette.types import Message, Send

sys.path.insert(0, str(Path(__file__).parent))

from planted_stack import _Wrapper, serve_wrapped  # noqa: E402


class SlowTail(_Wrapper):
    """Hold the first body message (the first event) of every slow stream for ``wait`` seconds."""

    share = 0.03
    wait = 1.5
    count = 0

    def wrap_send(self, send: Send) -> Send:
        index = SlowTail.count
        SlowTail.count += 1
        slow = math.floor((index + 1) * self.share) > math.floor(index * self.share)
        held = not slow

        async def sending(message: Message) -> None:
            nonlocal held
            if not held and message["type"] == "http.response.body":
                held = True
                await asyncio.sleep(self.wait)
            await send(message)

        return sending


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--share", type=float, default=0.03, help="the share of streams that wait")
    parser.add_argument("--wait", type=float, default=1.5, help="seconds they wait before their first event")
    args, rest = parser.parse_known_args(argv)
    SlowTail.share, SlowTail.wait = args.share, args.wait
    return serve_wrapped(SlowTail, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
