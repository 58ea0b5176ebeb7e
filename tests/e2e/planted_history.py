"""The builtin stack with one planted conversation defect: a server that reads only the last message.

    python tests/e2e/planted_history.py --defect drop_history [stack serve flags]

- ``drop_history``: a chat request is served as if it held only its last user message (a truncating
  gateway, a template that drops roles, a cache that serves a stale prompt); a completions prompt from
  its last ``User:`` line on (the transcript the sessions workload sends). Every answer streams as
  usual, fluently, and its ``usage.prompt_tokens`` counts what was really read.

This defect lives here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import chaos.stack.server as server
from chaos.stack.serve import serve_main

DEFECTS = ("drop_history",)


def plant_drop_history() -> None:
    prompt_ids = server._prompt_ids  # noqa: SLF001 - a planted defect reaches inside on purpose

    def last_message_only(stack: Any, req: Any) -> tuple[list[int], str]:
        if req.chat:
            users = [m for m in req.messages if m.get("role") == "user"]
            req = dataclasses.replace(req, messages=tuple(users[-1:]) or req.messages)
        elif isinstance(req.prompt, str) and "User: " in req.prompt:
            req = dataclasses.replace(req, prompt=req.prompt[req.prompt.rindex("User: "):])
        return prompt_ids(stack, req)

    server._prompt_ids = last_message_only  # noqa: SLF001


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", required=True, choices=DEFECTS, action="append")
    args, rest = parser.parse_known_args(argv)
    for defect in dict.fromkeys(args.defect):
        {"drop_history": plant_drop_history}[defect]()
    return serve_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
