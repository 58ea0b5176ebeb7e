"""The incremental SSE parser: framing variants, UTF-8 accounting, and any re-chunking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.load.sse import SSEEvent, SSEParser, decode_counting


def parse_all(chunks: list[bytes]) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events, parser


def test_lf_crlf_and_cr_line_ends_give_the_same_events() -> None:
    for sep in (b"\n", b"\r\n", b"\r"):
        stream = b"data: one" + sep + sep + b"data:two" + sep + sep
        events, parser = parse_all([stream])
        assert [e.data for e in events] == ["one", "two"], sep
        assert all(e.terminated for e in events)
        assert parser.utf8_errors == 0


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    events, _ = parse_all([b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"])
    assert [e.data for e in events] == ["a", "b"]


def test_comments_are_ignored_and_counted() -> None:
    events, parser = parse_all([b": keep-alive\n\n: ping\ndata: x\n\n"])
    assert [e.data for e in events] == ["x"]
    assert parser.comments == 2


def test_multiline_data_joined_with_newline_and_fields() -> None:
    events, _ = parse_all([b"event: delta\nid: 7\ndata: a\ndata:b\ndata\n\n"])
    assert events == [SSEEvent("a\nb\n", "delta", "7")]


def test_only_one_space_after_colon_is_stripped() -> None:
    events, _ = parse_all([b"data:  two spaces\n\n"])
    assert events[0].data == " two spaces"


def test_event_without_data_has_data_none() -> None:
    events, _ = parse_all([b"event: ping\n\n"])
    assert events == [SSEEvent(None, "ping", None)]


def test_unterminated_last_event_is_flagged() -> None:
    events, _ = parse_all([b"data: a\n\ndata: [DONE]"])
    assert [(e.data, e.terminated) for e in events] == [("a", True), ("[DONE]", False)]


def test_multibyte_split_across_reads_is_not_an_error_and_is_counted() -> None:
    raw = "data: 你好🙂\n\n".encode()
    start = raw.index("你".encode())
    # cut inside 你 (3 bytes) and inside 🙂 (4 bytes, cut after 1 and after 3)
    emoji = raw.index("🙂".encode())
    cuts = [start + 1, emoji + 1, emoji + 3]
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    events, parser = parse_all(chunks)
    assert events[0].data == "你好🙂"
    assert parser.utf8_errors == 0
    assert parser.split_chars == 2


def test_invalid_bytes_are_counted_per_byte_and_replaced() -> None:
    events, parser = parse_all([b"data: a\xffb\xe4\xbdc\n\n"])
    assert events[0].data == "a\ufffdb\ufffdc"
    assert parser.utf8_errors == 3  # 0xFF, then the truncated 2-byte prefix of a 3-byte character
    assert parser.split_chars == 0


def test_a_real_replacement_character_is_not_an_error() -> None:
    events, parser = parse_all(["data: \ufffd\n\n".encode()])
    assert events[0].data == "\ufffd" and parser.utf8_errors == 0


def test_decode_counting_matches_errors_replace() -> None:
    for raw in (b"\xc3", b"\xc3(", b"\xf0\x9f\x98", b"ok\xed\xa0\x80", b"\x80\x80abc"):
        text, bad = decode_counting(raw)
        assert text == raw.decode("utf-8", errors="replace")
        assert bad > 0


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=12)
_LINE = st.one_of(
    _TEXT.map(lambda t: "data: " + t),
    _TEXT.map(lambda t: "data:" + t),
    _TEXT.map(lambda t: ":" + t),
    _TEXT.map(lambda t: "event: " + t),
    _TEXT.map(lambda t: "id: " + t),
    st.just(""),
)
_SEP = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.tuples(_LINE, _SEP), max_size=25))
    raw = "".join(line + sep for line, sep in parts).encode()
    if draw(st.booleans()):  # sprinkle invalid bytes: counting must not depend on the split either
        noise = draw(st.lists(st.sampled_from([b"\xff", b"\xe4\xbd", b"\x80", b"\xf0\x9f"]), max_size=3))
        for junk in noise:
            at = draw(st.integers(0, len(raw)))
            raw = raw[:at] + junk + raw[at:]
    return raw


@given(streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=30))
@settings(max_examples=300, deadline=None)
def test_any_rechunking_parses_to_the_same_events(raw: bytes, cuts: list[int]) -> None:
    whole, whole_parser = parse_all([raw])
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    split, split_parser = parse_all(chunks)
    assert split == whole
    assert split_parser.utf8_errors == whole_parser.utf8_errors
    assert split_parser.comments == whole_parser.comments


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40),
       st.integers(1, 7))
@settings(max_examples=200, deadline=None)
def test_fixed_size_chunks_reassemble_text_and_count_split_characters(text: str, size: int) -> None:
    raw = f"data: {text}\n\n".encode()
    chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
    events, parser = parse_all(chunks)
    assert [e.data for e in events] == [text]
    assert parser.utf8_errors == 0
    expected_splits = 0
    offset = 6
    for ch in text:
        width = len(ch.encode())
        if width > 1 and any(offset < k < offset + width for k in range(size, len(raw), size)):
            expected_splits += 1
        offset += width
    assert parser.split_chars == expected_splits
