from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.stack.engine import IncrementalDetokenizer, Tokenizer

TOK = Tokenizer.load()
RICH = st.one_of(
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK ideographs (many rare)
    st.characters(min_codepoint=0x3040, max_codepoint=0x30FF),  # kana
    st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),  # hangul
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji
    st.sampled_from(list("abc xyz.,()\n\té\u00df")),
)
CLUSTERS = st.sampled_from(["👩‍💻", "👍🏽", "🇯🇵", "🦄", "龘", "𝄞"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(st.one_of(RICH, CLUSTERS), min_size=1, max_size=40).map("".join), data=st.data())
def test_deltas_complete_and_concatenate(text, data):
    ids = TOK.encode(text)
    detok = IncrementalDetokenizer(TOK)
    deltas = []
    i = 0
    while i < len(ids):
        n = data.draw(st.integers(min_value=1, max_value=3))
        deltas.append(detok.push(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    for d in deltas:
        assert "\ufffd" not in d
        d.encode("utf-8")  # no lone surrogates
    assert "".join(deltas) == TOK.decode(ids) == text


def test_holds_back_partial_character():
    ids = TOK.encode("a🦄b")
    detok = IncrementalDetokenizer(TOK)
    out = [detok.push([t]) for t in ids]
    assert out[0] == "a"
    assert "" in out[1:-1]  # some piece of the emoji was held back
    assert "".join(out) + detok.flush() == "a🦄b"


def test_flush_drops_a_character_cut_short():
    """max_tokens can stop mid-character: the fragment is dropped, never sent as U+FFFD."""
    ids = TOK.encode("x🦄")[:-1]
    assert TOK.decode(ids).endswith("\ufffd")  # the cut really leaves a partial character
    detok = IncrementalDetokenizer(TOK)
    text = detok.push(ids) + detok.flush()
    assert text == "x"


def test_special_tokens_skipped():
    detok = IncrementalDetokenizer(TOK)
    assert detok.push(TOK.encode("hi") + [TOK.eos_token_id]) + detok.flush() == "hi"
