"""Trace files read into plain records: Mooncake JSONL requests and ShareGPT conversations.

Mooncake (one JSON object a line)::

    {"timestamp": 0, "input_length": 1200, "output_length": 64, "hash_ids": [0, 1, 2]}

``timestamp`` is ms from the trace's start, ``input_length`` / ``output_length`` are tokens, and
``hash_ids`` names each block of ``block_tokens`` (512) prompt tokens: equal ids are identical blocks,
so a run of equal leading ids is a shared prefix. Other keys are ignored (real traces carry some).

ShareGPT (one JSON document, a list)::

    [{"id": "a1", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}]

Roles: ``human`` / ``user``, ``gpt`` / ``assistant``, and ``system`` (first turn only); after an
optional system turn the turns alternate user, assistant, starting with the user.

Every mistake is an ExperimentInvalid naming file:line:column, the key, what was found and what
would be right, found before any load is sent. A trace is a schedule, so timestamps going backwards
are refused rather than sorted. Reading is bounded: JSONL streams line by line (a line of at most
1 MiB, at most ``max_requests`` requests), a ShareGPT document is refused above ``max_bytes``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from chaos.model.errors import ExperimentInvalid, Problem

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_REQUESTS",
    "MAX_SHAREGPT_BYTES",
    "Conversation",
    "TraceRequest",
    "read_mooncake",
    "read_sharegpt",
]

MAX_LINE_BYTES = 1 << 20  # a Mooncake line of 128K tokens is about 2 KB; 1 MiB is a broken file
MAX_REQUESTS = 1_000_000  # about 300 MB of records; a longer trace is cut before it is given
MAX_SHAREGPT_BYTES = 128 << 20  # parsed whole: 128 MiB of JSON is about 1 GB of Python objects at worst
_MAX_PROBLEMS = 20  # a broken 2 GB file: the first 20 mistakes say enough

_SCHEMA = '{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [ids]}'
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class TraceRequest:
    """One request of a Mooncake trace: when (ms from the trace's start), how long, which prompt blocks."""

    t_ms: float
    input_length: int  # prompt tokens
    output_length: int  # tokens to generate (max_tokens)
    hash_ids: tuple[int, ...]  # one per block of block_tokens prompt tokens, the last one maybe partial


@dataclass(frozen=True)
class Conversation:
    """One ShareGPT conversation: turns of ("user" | "assistant", text), alternating, the user's first."""

    id: str
    turns: tuple[tuple[str, str], ...]
    system: str | None = None  # a leading system turn's text, kept apart from the alternating turns


class _Problems:
    """Problems of one file, collected up to _MAX_PROBLEMS, then raised together."""

    def __init__(self, path: Path) -> None:
        self.file = str(path)
        self.found: list[Problem] = []

    def add(self, line: int, column: int, key: str, message: str) -> None:
        self.found.append(Problem(file=self.file, line=line, column=column, path=key, message=message))
        if len(self.found) >= _MAX_PROBLEMS:
            self.raise_if_any()

    def raise_if_any(self) -> None:
        if self.found:
            raise ExperimentInvalid(self.found)


def read_mooncake(path: Path, *, block_tokens: int = 512, max_requests: int = MAX_REQUESTS) -> list[TraceRequest]:
    """The requests of a Mooncake JSONL trace, in file order (which must be time order).

    ``block_tokens`` is the trace's block size: each request needs exactly
    ceil(input_length / block_tokens) hash ids.
    """
    path = Path(path)
    problems = _Problems(path)
    requests: list[TraceRequest] = []
    last_t, last_line = -math.inf, 0
    for number, line in _jsonl_lines(path, problems):
        t, request = _mooncake_line(line, number, block_tokens, problems)
        if t is not None and t < last_t:  # any line with a time counts, wrong elsewhere or not
            problems.add(number, _column(line, "timestamp"), "timestamp",
                         f"{_num(t)} ms is before line {last_line}'s {_num(last_t)} ms; a trace is a schedule, so "
                         "its timestamps must not go backwards: sort it by timestamp "
                         "(jq -s -c 'sort_by(.timestamp)[]')")
            continue
        if t is not None:
            last_t, last_line = t, number
        if request is None:
            continue
        requests.append(request)
        if len(requests) > max_requests:
            problems.add(number, 1, "", f"more than {max_requests:,} requests; replay a part of the trace "
                                        f"(head -n {max_requests} {path} > part.jsonl)")
            break
    problems.raise_if_any()
    if not requests:
        raise ExperimentInvalid([Problem(str(path), 1, 1, "", f"the trace holds no requests; write one JSON object "
                                                              f"a line: {_SCHEMA}")])
    return requests


def _jsonl_lines(path: Path, problems: _Problems) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, read one at a time with its length bounded."""
    try:
        f = open(path, "rb")  # noqa: SIM115  (closed by the with below; bytes: a line is bounded before decoding)
    except OSError as exc:
        raise ExperimentInvalid([Problem(str(path), 0, 0, "", f"cannot read the trace: {exc.strerror}")]) from None
    with f:
        number = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                problems.add(number, 1, "", f"line longer than {MAX_LINE_BYTES >> 20} MiB; each line is one "
                                            f"request {_SCHEMA}")
                problems.raise_if_any()  # the rest of this line would read as more lines: stop here
            if not raw.strip():
                continue
            try:
                yield number, raw.decode("utf-8").lstrip("\ufeff")
            except UnicodeDecodeError as exc:
                problems.add(number, exc.start + 1, "", "not UTF-8 text; a trace line is a JSON object")


def _mooncake_line(line: str, number: int, block_tokens: int,
                   problems: _Problems) -> tuple[float | None, TraceRequest | None]:
    """(the line's timestamp where it has a good one, its request where the whole line is good)."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        column = getattr(exc, "colno", 1)
        problems.add(number, column, "", f"not JSON ({getattr(exc, 'msg', exc)}); each line is one object {_SCHEMA}")
        return None, None
    except RecursionError:
        problems.add(number, 1, "", f"JSON nested too deep; each line is one object {_SCHEMA}")
        return None, None
    if not isinstance(obj, dict):
        problems.add(number, 1, "", f"a JSON {_json_type(obj)}, not an object; each line is one object {_SCHEMA}")
        return None, None
    t = _timestamp(obj, line, number, problems)
    input_length = _length(obj, "input_length", line, number, problems)
    output_length = _length(obj, "output_length", line, number, problems)
    hash_ids = _hash_ids(obj, input_length, block_tokens, line, number, problems)
    if t is None or input_length is None or output_length is None or hash_ids is None:
        return t, None
    return t, TraceRequest(t_ms=t, input_length=input_length, output_length=output_length, hash_ids=hash_ids)


def _timestamp(obj: dict[str, Any], line: str, number: int, problems: _Problems) -> float | None:
    if "timestamp" not in obj:
        problems.add(number, 1, "timestamp", "missing; expected the request's send time in ms from the trace's start")
        return None
    t = obj["timestamp"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        problems.add(number, _column(line, "timestamp"), "timestamp",
                     f"{_clip(json.dumps(t))} is not a time; expected a number of ms >= 0 from the trace's start")
        return None
    return float(t)


def _length(obj: dict[str, Any], key: str, line: str, number: int, problems: _Problems) -> int | None:
    what = "prompt tokens" if key == "input_length" else "tokens to generate"
    if key not in obj:
        problems.add(number, 1, key, f"missing; expected a whole number >= 1 of {what}")
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        found = "not a whole number" if isinstance(value, float) else f"a JSON {_json_type(value)}"
        problems.add(number, _column(line, key), key,
                     f"{_clip(json.dumps(value))} is {found}; expected a whole number >= 1 of {what}")
        return None
    if value < 1:
        problems.add(number, _column(line, key), key,
                     f"{value} is {'negative' if value < 0 else 'zero'}; expected a whole number >= 1 of {what}")
        return None
    return value


def _hash_ids(obj: dict[str, Any], input_length: int | None, block_tokens: int, line: str, number: int,
              problems: _Problems) -> tuple[int, ...] | None:
    if "hash_ids" not in obj:
        problems.add(number, 1, "hash_ids", f"missing; expected a list of ids, one per block of {block_tokens} "
                                            "prompt tokens (equal ids: identical blocks)")
        return None
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        problems.add(number, _column(line, "hash_ids"), "hash_ids",
                     f"expected a list of integer ids, one per block of {block_tokens} prompt tokens, found "
                     f"{_clip(json.dumps(ids))}")
        return None
    if input_length is None:
        return None
    need = math.ceil(input_length / block_tokens)
    if len(ids) != need:
        problems.add(number, _column(line, "hash_ids"), "hash_ids",
                     f"{len(ids)} id{'' if len(ids) == 1 else 's'} for input_length {input_length}; expected "
                     f"ceil({input_length}/{block_tokens}) = {need}, one per block of {block_tokens} prompt tokens "
                     "(a trace of another block size: set load.workload.block_tokens)")
        return None
    return tuple(ids)


def read_sharegpt(path: Path, *, max_bytes: int = MAX_SHAREGPT_BYTES) -> list[Conversation]:
    """The conversations of a ShareGPT JSON file, in file order."""
    path = Path(path)
    problems = _Problems(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ExperimentInvalid([Problem(str(path), 1, 1, "", (
                f"{_size(size)}; a ShareGPT file is parsed whole, so at most {_size(max_bytes)} are read: keep the "
                f"conversations to replay (jq '.[:1000]' {path} > part.json)"))])
        data = path.read_bytes()
    except OSError as exc:
        raise ExperimentInvalid([Problem(str(path), 0, 0, "", f"cannot read the conversations: {exc.strerror}")]) \
            from None
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ExperimentInvalid([Problem(str(path), line, 0, "", "not UTF-8 text; a ShareGPT file is JSON")]) from None
    conversations: list[Conversation] = []
    seen: dict[str, int] = {}
    for index, line, item in _list_items(text, problems):
        conv = _conversation(item, index, line, problems)
        if conv is None:
            continue
        if conv.id in seen:
            problems.add(line, 1, f"[{index}].id", f"{conv.id!r} is also conversation [{seen[conv.id]}]'s id; "
                                                   "each conversation needs its own")
            continue
        seen[conv.id] = index
        conversations.append(conv)
    problems.raise_if_any()
    if not conversations:
        raise ExperimentInvalid([Problem(str(path), 1, 1, "", 'holds no conversations; expected a JSON list of '
                                                              '{"id": ..., "conversations": [{"from": "human", '
                                                              '"value": ...}, ...]}')])
    return conversations


def _list_items(text: str, problems: _Problems) -> list[tuple[int, int, Any]]:
    """(index, line, value) of each item of the top-level JSON list: parsed one item at a time, so a
    problem is located at its conversation's line (json.load would know only the document's)."""
    reader = _ListReader(text, problems)
    pos = _skip_ws(text, 0)
    if pos >= len(text):
        return []
    if text[pos] != "[":
        reader.fail(pos, 'expected a JSON list of conversations [{"id": ..., "conversations": [...]}, ...]')
    pos = _skip_ws(text, pos + 1)
    if text.startswith("]", pos):
        reader.end(pos)
        return []
    while True:
        pos = reader.item(pos)
        if text.startswith("]", pos):
            reader.end(pos)
            return reader.items
        if not text.startswith(",", pos):
            reader.fail(pos, f"expected ',' or ']' after conversation [{len(reader.items) - 1}]")
        pos = _skip_ws(text, pos + 1)


class _ListReader:
    """The items of a JSON list read one by one, with their line numbers counted once through the text."""

    def __init__(self, text: str, problems: _Problems) -> None:
        self.text = text
        self.problems = problems
        self.items: list[tuple[int, int, Any]] = []
        self._decoder = json.JSONDecoder()
        self._counted, self._line = 0, 1  # lines counted up to text[_counted]: linear in the file

    def line_of(self, at: int) -> int:
        self._line += self.text.count("\n", self._counted, at)
        self._counted = at
        return self._line

    def item(self, pos: int) -> int:
        """Parse the item at ``pos``; where the text goes on after it."""
        index = len(self.items)
        try:
            value, end = self._decoder.raw_decode(self.text, pos)
        except json.JSONDecodeError as exc:
            self.fail(exc.pos, f"not JSON ({exc.msg}) in conversation [{index}]")
        except RecursionError:
            self.fail(pos, f"JSON nested too deep in conversation [{index}]")
        self.items.append((index, self.line_of(pos), value))
        return _skip_ws(self.text, end)

    def end(self, pos: int) -> None:
        rest = _skip_ws(self.text, pos + 1)
        if rest < len(self.text):
            self.fail(rest, "text after the list of conversations; the file is one JSON list")

    def fail(self, at: int, message: str) -> NoReturn:
        line = self.line_of(at) if at >= self._counted else self.text.count("\n", 0, at) + 1
        self.problems.add(line, at - (self.text.rfind("\n", 0, at) + 1) + 1, "", message)
        raise ExperimentInvalid(self.problems.found)


def _conversation(item: Any, index: int, line: int, problems: _Problems) -> Conversation | None:
    where = f"[{index}]"
    if not isinstance(item, dict):
        problems.add(line, 1, where, f"a JSON {_json_type(item)}; expected a conversation "
                                     '{"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}')
        return None
    raw_id = item.get("id", str(index))
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        problems.add(line, 1, f"{where}.id", f"{_clip(json.dumps(raw_id))}; expected a string (or leave it out: "
                                             "the conversation's index is its id then)")
        return None
    turns_raw = item.get("conversations")
    if not isinstance(turns_raw, list) or not turns_raw:
        found = "missing" if "conversations" not in item else f"{_clip(json.dumps(turns_raw))}"
        problems.add(line, 1, f"{where}.conversations", f"{found}; expected a non-empty list of turns "
                                                        '{"from": "human" | "gpt", "value": "..."}')
        return None
    system: str | None = None
    turns: list[tuple[str, str]] = []
    for j, turn in enumerate(turns_raw):
        key = f"{where}.conversations[{j}]"
        parsed = _turn(turn, key, line, problems)
        if parsed is None:
            return None
        role, value = parsed
        if role == "system" and j == 0:
            system = value
            continue
        mistake = _misplaced(role, str(turn.get("from")), turns)
        if mistake is not None:
            problems.add(line, 1, f"{key}.from", mistake)
            return None
        turns.append((role, value))
    if not turns:
        problems.add(line, 1, f"{where}.conversations", "only a system turn; expected a user turn after it")
        return None
    return Conversation(id=str(raw_id), turns=tuple(turns), system=system)


def _turn(turn: Any, key: str, line: int, problems: _Problems) -> tuple[str, str] | None:
    """(role, text) of one turn, the role one of user, assistant, system."""
    if not isinstance(turn, dict):
        problems.add(line, 1, key, f"a JSON {_json_type(turn)}; expected a turn "
                                   '{"from": "human" | "gpt", "value": "..."}')
        return None
    role_raw, value = turn.get("from"), turn.get("value")
    role = _ROLES.get(role_raw) if isinstance(role_raw, str) else None
    if role is None:
        found = "missing" if "from" not in turn else f"{_clip(json.dumps(role_raw))} is not a role"
        problems.add(line, 1, f"{key}.from", f"{found}; expected one of human, gpt (or user, assistant, system)")
        return None
    if not isinstance(value, str):
        found = "missing" if "value" not in turn else f"a JSON {_json_type(value)}"
        problems.add(line, 1, f"{key}.value", f"{found}; expected the turn's text as a string")
        return None
    if role == "user" and not value.strip():
        problems.add(line, 1, f"{key}.value", "an empty user turn; a replay sends it as a prompt: give it text")
        return None
    return role, value


def _misplaced(role: str, role_raw: str, turns: list[tuple[str, str]]) -> str | None:
    """Why a turn of ``role`` cannot follow ``turns``, or None where it can."""
    if role == "system":
        return "a system turn after the first; a system prompt opens the conversation (move it to the start)"
    if not turns and role != "user":
        return (f"the conversation starts with a {role_raw} turn; a replay sends the user's turn first "
                "(drop the leading assistant turns)")
    if turns and turns[-1][0] == role:
        return f"two {role} turns in a row; the turns alternate user, assistant (merge them into one)"
    return None


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _column(line: str, key: str) -> int:
    """1-based column of ``"key"`` in a JSONL line (where an editor should jump), 1 where it is not found."""
    return line.find(f'"{key}"') + 1 or 1


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "object"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _size(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
