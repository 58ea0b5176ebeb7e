"""The stream hop's SSE parsing (chaos.hops.streamhop.sse): whole events out of reads cut anywhere,
byte for byte, and each event's kind and digest as a tap records them; and the upstream body's framing
under it (chaos.hops.streamhop.framing). Pure, sub-second."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from chaos.hops.streamhop.framing import BodyReader, FramingError
from chaos.hops.streamhop.sse import DONE_EVENT, KEEPALIVE_EVENT, EventParser, classify, digest, utf8_inner_offsets
from chaos.model.observations import TAP_EVENT_KINDS


def _chunk(i: int, finish: str | None = None) -> bytes:
    body = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"tok{i} é日本", "finish_reason": finish}]}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


STREAM = b"".join([_chunk(i) for i in range(5)] + [_chunk(5, "stop"),
                  b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":6}}\n\n',
                  KEEPALIVE_EVENT, DONE_EVENT])


def _feed_in_pieces(data: bytes, cuts: list[int]) -> tuple[list[bytes], bytes]:
    parser = EventParser()
    events: list[bytes] = []
    last = 0
    for at in sorted(cuts) + [len(data)]:
        events += parser.feed(data[last:at])
        last = at
    final, rest = parser.finish()
    return events + final, rest


def test_events_come_out_whole_and_byte_for_byte_wherever_the_reads_are_cut() -> None:
    whole, rest = _feed_in_pieces(STREAM, [])
    assert len(whole) == 9 and rest == b""
    assert b"".join(whole) == STREAM
    rng = random.Random(7)
    for _ in range(200):
        cuts = rng.sample(range(1, len(STREAM)), rng.randint(1, 30))
        events, rest = _feed_in_pieces(STREAM, cuts)
        assert events == whole and rest == b""


def test_an_event_is_returned_as_soon_as_its_blank_line_arrives() -> None:
    parser = EventParser()
    assert parser.feed(b"data: a\n") == []
    assert parser.buffered == 8
    assert parser.feed(b"\n") == [b"data: a\n\n"]
    assert parser.buffered == 0


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_every_line_end_of_the_grammar_ends_events(eol: bytes) -> None:
    stream = b"data: one" + eol + eol + b": note" + eol + eol + b"event: x" + eol + b"data: two" + eol + eol
    for cut in range(1, len(stream)):
        events, rest = _feed_in_pieces(stream, [cut])
        assert b"".join(events) + rest == stream
        assert [classify(e)[0] for e in events] == ["data", "comment", "data"], (eol, cut)
        assert rest == b""


def test_a_carriage_return_at_the_end_of_a_read_waits_for_its_line_feed() -> None:
    parser = EventParser()
    assert parser.feed(b"data: a\r\n\r") == []  # the CR may be the first half of CRLF
    assert parser.feed(b"\n") == [b"data: a\r\n\r\n"]


def test_an_unfinished_event_stays_buffered_until_taken() -> None:
    parser = EventParser()
    assert parser.feed(b"data: a\n\ndata: b") == [b"data: a\n\n"]
    assert parser.take() == b"data: b"
    assert parser.buffered == 0


@pytest.mark.parametrize("event, kind", [
    (_chunk(1), "data"),
    (_chunk(1, "stop"), "finish"),
    (_chunk(1, "length"), "finish"),
    (b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', "usage"),
    (b'data: {"choices":[{"finish_reason":null}],"usage":null}\n\n', "data"),
    (b'data: {"error": {"message": "boom", "type": "x"}}\n\n', "error"),
    (b'data:{"error":{"message":"boom"}}\n\n', "error"),
    (DONE_EVENT, "done"),
    (b"data:[DONE]\n\n", "done"),
    (KEEPALIVE_EVENT, "comment"),
    (b"event: ping\n\n", "comment"),
    (b"\n\n", ""),
])
def test_kinds_are_the_taps_kinds(event: bytes, kind: str) -> None:
    assert classify(event)[0] == kind
    assert kind in TAP_EVENT_KINDS or kind == ""


def test_the_payload_is_the_dispatched_data_and_the_digest_its_sha256_prefix() -> None:
    assert classify(b"data: hello\n\n") == ("data", b"hello")
    assert classify(b"data:hello\n\n") == ("data", b"hello")
    assert classify(b"id: 3\ndata: a\ndata:  b\n\n") == ("data", b"a\n b")
    assert classify(b"event: e\r\ndata: x\r\n\r\n") == ("data", b"x")
    payload = b'{"a": 1}'
    assert digest(payload) == hashlib.sha256(payload).hexdigest()[:16]
    # the same payload under other framing has the same digest: two taps around a gateway compare
    assert digest(classify(b"data: x\r\n\r\n")[1]) == digest(classify(b"data:x\n\n")[1])


def test_utf8_inner_offsets_are_inside_multibyte_characters() -> None:
    data = "aé日".encode()  # 61 | c3 a9 | e6 97 a5
    offsets = utf8_inner_offsets(data)
    assert offsets == [2, 4, 5]
    for at in offsets:
        with pytest.raises(UnicodeDecodeError):
            data[:at].decode()
    assert utf8_inner_offsets(b"plain ascii") == []


# -- the upstream body's framing (chaos.hops.streamhop.framing), undone on the hot path -------------------
def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_chunked_bodies_come_out_whole_wherever_the_reads_are_cut() -> None:
    pieces = [_chunk(i) for i in range(20)]
    wire = _chunked(pieces)
    rng = random.Random(3)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(wire)), rng.randint(0, 25))) + [len(wire)]
        reader, out, last = BodyReader("chunked"), b"", 0
        for at in cuts:
            out += reader.feed(wire[last:at])
            last = at
        assert out == b"".join(pieces) and reader.done and reader.pending == 0


def test_chunk_extensions_and_trailers_are_read_past() -> None:
    reader = BodyReader("chunked")
    body = reader.feed(b"5;name=v\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert body == b"hello" and reader.done


@pytest.mark.parametrize("wire, reason", [
    (b"zz\r\nhello\r\n", "not hex"),
    (b"5\r\nhelloXX", "not followed by CRLF"),
    (b"-5\r\nhello\r\n", "not hex"),
    (b"5" * 5000, "too long"),
    (b"11111111111111111\r\n", "not hex"),
])
def test_broken_chunked_framing_is_refused(wire: bytes, reason: str) -> None:
    with pytest.raises(FramingError, match=reason):
        BodyReader("chunked").feed(wire)


def test_length_and_close_delimited_bodies() -> None:
    reader = BodyReader("length", 8)
    assert reader.feed(b"abc") == b"abc" and not reader.done
    assert reader.feed(b"defghXYZ") == b"defgh" and reader.done
    assert BodyReader("length", 0).done
    close = BodyReader("close")
    assert close.feed(b"abc") == b"abc" and not close.done
    assert close.eof() and close.done
    cut = BodyReader("chunked")
    cut.feed(b"5\r\nhe")
    assert not cut.eof()  # the connection ended inside a chunk: a broken body, not an end
