"""The builtin stack with one planted tool-call defect: a server (or a relay) that breaks streamed tool calls.

    python tests/e2e/planted_tool_calls.py --defect DEFECT [stack serve flags]

- ``truncate``: a call's closing ``"}`` fragment is sent empty: the arguments stop mid-string (a relay that
  drops the last fragment, a server that ends the call at ``max_tokens`` without closing it), and the
  stream still ends cleanly with ``finish_reason: "tool_calls"`` and ``[DONE]``.
- ``corrupt``: each argument fragment goes out without JSON escaping (a quote in the generated text ends
  the string early) and the first loses its opening brace: the fragments join into no JSON object.
- ``rename``: the call's last fragment names another function (a name changed mid-call).

Everything else is the real builtin stack. These defects live here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from chaos.stack.serve import serve_main
from chaos.stack.tool_calls import ToolCallStream

DEFECTS = ("truncate", "corrupt", "rename")


def plant_truncate() -> None:
    def close(self: ToolCallStream) -> dict[str, Any]:
        self.opened = True
        return self._arguments("")  # noqa: SLF001 - a planted defect reaches inside on purpose

    ToolCallStream.close = close  # type: ignore[method-assign]


def plant_corrupt() -> None:
    def fragment(self: ToolCallStream, text: str) -> dict[str, Any]:
        piece = text + '"'  # unescaped, and a stray quote: the string ends inside the text
        if not self.opened:
            self.opened = True
            piece = json.dumps(self.call.key) + ': "' + piece  # no opening brace
        return self._arguments(piece)  # noqa: SLF001

    ToolCallStream.fragment = fragment  # type: ignore[method-assign]


def plant_rename() -> None:
    close = ToolCallStream.close

    def renamed(self: ToolCallStream) -> dict[str, Any]:
        delta = close(self)
        delta["tool_calls"][0]["function"]["name"] = self.call.name + "_other"
        return delta

    ToolCallStream.close = renamed  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", required=True, choices=DEFECTS)
    args, rest = parser.parse_known_args(argv)
    {"truncate": plant_truncate, "corrupt": plant_corrupt, "rename": plant_rename}[args.defect]()
    return serve_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
