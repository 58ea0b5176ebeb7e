"""The journal file never jams (issue 41 review): a line holding a lone UTF-16 surrogate (what a JSON
``"\\ud800"`` decodes to) cannot be UTF-8, so it is written with U+FFFD in its place; before, it raised
``UnicodeEncodeError`` and, left held, made every later write of the run fail with it."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.host.journal_file import JournalFile


def test_a_lone_surrogate_is_written_as_u_fffd_and_later_lines_still_land(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = JournalFile(path, create=True)
    journal.write({"type": "stream", "text": "a\ud800b", "k\udfff": 1}, hold=True)  # a dict: json.dumps keeps it
    journal.write('{"type":"note","text":"c\udc80d"}')  # a str (orjson's fallback writes one)
    journal.write({"type": "fault_revert", "fault": "f", "text": "\U0001f600 é"}, durable=True)
    journal.close()
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"type": "stream", "text": "a\ufffdb", "k\ufffd": 1}, {"type": "note", "text": "c\ufffdd"},
                     {"type": "fault_revert", "fault": "f", "text": "\U0001f600 é"}]
