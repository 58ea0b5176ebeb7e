"""The parser's fast path (a read that is exactly one one-line ``data:`` event) gives what the general
path gives for the same bytes: events, invalid-byte counts, and the state the next read sees."""

from __future__ import annotations

from chaos.load.sse import SSEEvent, SSEParser

READS = [
    b'data: {"text":"a"}\n\n',
    b"data: caf\xc3\xa9 \xff\xfe ok\n\n",  # valid multibyte and two invalid bytes
    b"data:no-space\n\n",  # not the fast path's shape
    b"event: x\ndata: y\n\n",
    b"data: [DONE]\n\n",
    b"data: trailing",  # unterminated: state carries into close()
]


def parse(reads: list[bytes]) -> tuple[list[SSEEvent], int, list[SSEEvent]]:
    parser = SSEParser()
    events = [e for r in reads for e in parser.feed(r)]
    return events, parser.utf8_errors, parser.close()


def test_one_event_per_read_equals_the_whole_stream_at_once() -> None:
    per_read = parse(READS)
    whole = parse([b"".join(READS)])
    assert per_read == whole
    events, bad, tail = per_read
    assert [e.data for e in events] == ['{"text":"a"}', "caf\u00e9 \ufffd\ufffd ok", "no-space", "y", "[DONE]"]
    assert events[3].event == "x" and bad == 2
    assert [e.data for e in tail] == ["trailing"] and not tail[0].terminated


def test_a_pending_field_keeps_the_general_path() -> None:
    parser = SSEParser()
    assert parser.feed(b"id: 7\n") == []
    assert parser.feed(b"data: z\n\n") == [SSEEvent("z", None, "7")]  # the id belongs to this event
