"""JSON that cannot cost more than its size: depth, integer digits and lone surrogates bounded.

``json.loads`` alone turns four cheap request shapes into a 500 or a long stall: 100,000 nested
brackets (``RecursionError``), a 5,000-digit integer (``ValueError`` from Python's digit limit, and
quadratic work below it), and a lone UTF-16 surrogate (``"\\ud800"``), which decodes to a ``str``
that cannot be encoded again, so it fails later in the tokenizer or in the JSON response that echoes
it. ``loads_bounded`` refuses each with a ``JsonRefused`` naming where it is. Pure and stdlib-only:
the builtin stack's request guard and the run's reads of a target's answers (``chaos.host.capped``)
share it, and it loads inside vLLM's interpreter, which has none of our dependencies.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "JsonRefused", "loads_bounded"]

MAX_DEPTH = 64  # an OpenAI request nests about 5 deep (messages[i].content[j].text)
MAX_INT_DIGITS = 32  # a seed is at most 20 digits; int() of long digit strings is quadratic
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonRefused(ValueError):
    """The body is not JSON we accept; ``path`` says where (``messages[0].content``), if known."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonRefused(f"an integer of {len(text)} digits; at most {MAX_INT_DIGITS} are accepted")
    return int(text)


def _render(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def loads_bounded(body: bytes | str) -> Any:
    """``json.loads`` within budgets; raise ``JsonRefused`` (a ``ValueError``) saying what and where.

    Checks, after a C-speed parse: nesting depth at most ``MAX_DEPTH``, integers of at most
    ``MAX_INT_DIGITS`` digits, and no lone surrogate in any string or key.
    """
    try:
        data = json.loads(body, parse_int=_parse_int)
    except RecursionError:
        raise JsonRefused(f"nested more than {MAX_DEPTH} levels deep") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JsonRefused(f"not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. a float such as 1e99999 is fine, but a digit limit is not
        raise JsonRefused(str(exc)) from None
    _walk(data)
    return data


def _walk(data: Any) -> None:
    """Depth and string checks without recursion (the parsed value may be ~1000 levels deep)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise JsonRefused(f"nested more than {MAX_DEPTH} levels deep", _render(path[:1]) or None)  # the field
        if isinstance(value, str):
            _text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _text(key, path)
                stack.append((item, path + (key,)))
        elif isinstance(value, list):
            stack.extend((item, path + (i,)) for i, item in enumerate(value))


def _text(value: str, path: tuple[str | int, ...]) -> None:
    found = _SURROGATE.search(value)
    if found is not None:
        code = f"\\u{ord(found.group()):04x}"
        raise JsonRefused(
            f"a string holds a lone UTF-16 surrogate ({code}) at character {found.start()}, which is not "
            "Unicode text; send the character itself, or a surrogate pair", _render(path) or None,
        )
