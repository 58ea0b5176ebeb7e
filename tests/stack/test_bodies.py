"""JSON budgets of request bodies (pure functions): what is refused, and where it is said to be."""

from __future__ import annotations

import pytest

from chaos.stack.bodies import MAX_DEPTH, MAX_INT_DIGITS, JsonRefused, loads_bounded


def test_a_normal_request_passes_untouched() -> None:
    body = (b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", '
            b'"text": "\\u00e9\\ud83d\\ude00"}]}], "seed": 12345678901234567890}')
    data = loads_bounded(body)
    assert data["messages"][0]["content"][0]["text"] == "é😀" and data["seed"] == 12345678901234567890


@pytest.mark.parametrize(
    ("body", "message", "path"),
    [
        (b'{"prompt": "a\\ud800b"}', "lone UTF-16 surrogate (\\ud800) at character 1", "prompt"),
        (b'{"messages": [{"content": "\\udfff"}]}', "(\\udfff)", "messages[0].content"),
        (b'{"\\ud800": 1}', "surrogate", None),
        (b"[" * 100_000 + b"]" * 100_000, f"nested more than {MAX_DEPTH} levels", None),
        (b'{"a": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", f"nested more than {MAX_DEPTH} levels",
         "a"),
        (b'{"n": ' + b"1" * (MAX_INT_DIGITS + 1) + b"}", f"at most {MAX_INT_DIGITS} are accepted", None),
        (b'{"n": -' + b"1" * 5000 + b"}", "an integer of 5001 digits", None),
        (b"\xff", "not valid JSON", None),
        (b"{", "not valid JSON", None),
    ],
)
def test_refused_with_what_and_where(body: bytes, message: str, path: str | None) -> None:
    with pytest.raises(JsonRefused) as caught:
        loads_bounded(body)
    assert message in caught.value.message, caught.value.message
    if path is not None:
        assert caught.value.path == path
