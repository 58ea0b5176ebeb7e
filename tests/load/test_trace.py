"""Trace files: Mooncake JSONL requests and ShareGPT conversations, read or refused with file:line and key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from chaos.load.workloads.trace import Conversation, TraceRequest, read_mooncake, read_sharegpt
from chaos.model.errors import ExperimentInvalid

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "experiments" / "traces"


def _refusal(read: object, path: Path, **kwargs: object) -> ExperimentInvalid:
    with pytest.raises(ExperimentInvalid) as caught:
        read(path, **kwargs)  # type: ignore[operator]
    return caught.value


def _write(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}'


# -- Mooncake ------------------------------------------------------------------------------------------
def test_a_mooncake_trace_reads_into_requests_in_order(tmp_path: Path) -> None:
    path = _write(tmp_path, [
        GOOD,
        "",  # blank lines are skipped
        '{"timestamp": 12.5, "input_length": 512, "output_length": 1, "hash_ids": [1], "extra": "ignored"}',
        '{"timestamp": 12.5, "input_length": 1025, "output_length": 300, "hash_ids": [1, 2, 9]}',
    ])
    assert read_mooncake(path) == [
        TraceRequest(t_ms=0.0, input_length=600, output_length=8, hash_ids=(1, 2)),
        TraceRequest(t_ms=12.5, input_length=512, output_length=1, hash_ids=(1,)),
        TraceRequest(t_ms=12.5, input_length=1025, output_length=300, hash_ids=(1, 2, 9)),
    ]


def test_block_tokens_sets_how_many_hash_ids_a_request_needs(tmp_path: Path) -> None:
    path = _write(tmp_path, ['{"timestamp": 0, "input_length": 130, "output_length": 8, "hash_ids": [4, 5, 6]}'])
    assert read_mooncake(path, block_tokens=64)[0].hash_ids == (4, 5, 6)
    problem = _refusal(read_mooncake, path).problems[0]
    assert problem.path == "hash_ids" and "expected ceil(130/512) = 1" in problem.message


@pytest.mark.parametrize(("line", "key", "says"), [
    ("not json", "", "not JSON"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]', "", "not JSON"),
    ("[1, 2]", "", "a JSON list, not an object"),
    ('{"input_length": 600, "output_length": 8, "hash_ids": [1, 2]}', "timestamp", "missing"),
    ('{"timestamp": -1, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}', "timestamp", ">= 0"),
    ('{"timestamp": "0", "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}', "timestamp", "not a time"),
    ('{"timestamp": NaN, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}', "timestamp", "not a time"),
    ('{"timestamp": 0, "output_length": 8, "hash_ids": [1, 2]}', "input_length", "missing"),
    ('{"timestamp": 0, "input_length": -600, "output_length": 8, "hash_ids": []}', "input_length", "negative"),
    ('{"timestamp": 0, "input_length": 600.5, "output_length": 8, "hash_ids": [1, 2]}', "input_length",
     "not a whole number"),
    ('{"timestamp": 0, "input_length": "600", "output_length": 8, "hash_ids": [1, 2]}', "input_length",
     "a JSON string"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 0, "hash_ids": [1, 2]}', "output_length", "zero"),
    ('{"timestamp": 0, "input_length": 600, "output_length": true, "hash_ids": [1, 2]}', "output_length",
     "a JSON boolean"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 8}', "hash_ids", "missing"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1]}', "hash_ids",
     "1 id for input_length 600; expected ceil(600/512) = 2"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, 2, 3]}', "hash_ids",
     "3 ids for input_length 600; expected ceil(600/512) = 2"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, "b"]}', "hash_ids",
     "a list of integer ids"),
    ("[" * 100_000, "", "nested too deep"),
])
def test_each_bad_line_is_refused_at_its_line_with_its_key(tmp_path: Path, line: str, key: str, says: str) -> None:
    path = _write(tmp_path, [GOOD, line])
    refusal = _refusal(read_mooncake, path)
    assert len(refusal.problems) == 1, str(refusal)
    problem = refusal.problems[0]
    assert (problem.file, problem.line, problem.path) == (str(path), 2, key)
    assert says in problem.message
    assert str(refusal).startswith(f"{path}:2:") and (not key or f" {key}: " in str(refusal))
    if key:  # the column is where the key stands (an editor jumps there), or 1 where it is missing
        assert problem.column in (1, line.find(f'"{key}"') + 1)


def test_a_missing_key_says_what_would_be_right(tmp_path: Path) -> None:
    path = _write(tmp_path, ['{"timestamp": 0, "output_length": 8, "hash_ids": []}'])
    assert str(_refusal(read_mooncake, path)) == \
        f"{path}:1:1: input_length: missing; expected a whole number >= 1 of prompt tokens"


def test_timestamps_going_backwards_are_refused_not_sorted(tmp_path: Path) -> None:
    path = _write(tmp_path, [GOOD.replace('"timestamp": 0', '"timestamp": 900'),
                             GOOD.replace('"timestamp": 0', '"timestamp": 1500'),
                             GOOD.replace('"timestamp": 0', '"timestamp": 1200')])
    problem = _refusal(read_mooncake, path).problems[0]
    assert (problem.line, problem.column, problem.path) == (3, 2, "timestamp")
    assert "1200 ms is before line 2's 1500 ms" in problem.message and "sort it by timestamp" in problem.message
    # a line wrong in another key still has its time in the order
    path = _write(tmp_path, [GOOD.replace('"timestamp": 0', '"timestamp": 1500').replace("[1, 2]", "[1]"), GOOD])
    assert [(p.line, p.path) for p in _refusal(read_mooncake, path).problems] == [(1, "hash_ids"), (2, "timestamp")]


def test_every_problem_of_a_file_is_listed_up_to_twenty(tmp_path: Path) -> None:
    two = _refusal(read_mooncake, _write(tmp_path, ["nope", GOOD, '{"timestamp": 1}']))
    assert [(p.line, p.path) for p in two.problems] == [(1, ""), (3, "input_length"), (3, "output_length"),
                                                        (3, "hash_ids")]
    many = _refusal(read_mooncake, _write(tmp_path, ["nope"] * 1000))
    assert len(many.problems) == 20 and many.problems[-1].line == 20


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_an_empty_trace_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    assert str(_refusal(read_mooncake, path)).startswith(f"{path}:1:1: the trace holds no requests")


def test_reading_is_bounded_a_line_and_a_count_at_a_time(tmp_path: Path) -> None:
    long_line = tmp_path / "long.jsonl"
    long_line.write_text(GOOD + "\n" + '{"pad": "' + "x" * (1 << 20) + '"}\n' + GOOD + "\n", encoding="utf-8")
    problem = _refusal(read_mooncake, long_line).problems[0]
    assert problem.line == 2 and "line longer than 1 MiB" in problem.message
    path = _write(tmp_path, [GOOD] * 4)
    problem = _refusal(read_mooncake, path, max_requests=3).problems[0]
    assert problem.line == 4 and "more than 3 requests" in problem.message
    assert len(read_mooncake(path, max_requests=4)) == 4


def test_unreadable_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    assert "cannot read the trace" in str(_refusal(read_mooncake, tmp_path / "absent.jsonl"))
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"timestamp": 0, "x": "\xe9"}\n')
    problem = _refusal(read_mooncake, path).problems[0]
    assert (problem.line, problem.column) == (2, 24) and "not UTF-8" in problem.message


def _sample_trace_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sample_trace", ROOT / "scripts" / "sample_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_mooncake_sample_is_what_its_script_writes_and_shares_prefixes() -> None:
    path = TRACES / "sample-mooncake.jsonl"
    script = _sample_trace_script()
    assert path.read_text(encoding="utf-8") == script.render(script.mooncake_sample()), \
        "run python scripts/sample_trace.py"
    requests = read_mooncake(path)
    assert 180 <= len(requests) <= 220 and 15_000 <= requests[-1].t_ms <= 20_000
    assert all(200 <= r.input_length <= 4000 and 16 <= r.output_length <= 256 for r in requests)
    first_blocks = [r.hash_ids[0] for r in requests]
    assert max(first_blocks.count(b) for b in set(first_blocks)) >= 30  # an app's system prompt, resent
    # conversations: a later request starts with all the full blocks of an earlier one, and goes on
    grown = sum(1 for i, r in enumerate(requests) for e in requests[:i]
                if e.input_length >= 1024 and r.hash_ids[: e.input_length // 512] == e.hash_ids[: e.input_length // 512]
                and len(r.hash_ids) > len(e.hash_ids))
    assert grown >= 20


# -- ShareGPT ------------------------------------------------------------------------------------------
def _sharegpt(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path


def _turns(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"from": role, "value": text} for role, text in pairs]


def test_sharegpt_conversations_read_with_roles_mapped(tmp_path: Path) -> None:
    path = _sharegpt(tmp_path, [
        {"id": "a", "conversations": _turns(("human", "Hi"), ("gpt", "Hello"), ("human", "Bye"))},
        {"id": 7, "conversations": _turns(("system", "Be brief."), ("user", "Sum 2+2"), ("assistant", "4"))},
        {"conversations": _turns(("human", "No id here"))},
    ])
    assert read_sharegpt(path) == [
        Conversation("a", (("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"))),
        Conversation("7", (("user", "Sum 2+2"), ("assistant", "4")), system="Be brief."),
        Conversation("2", (("user", "No id here"),)),
    ]


def test_the_shipped_sharegpt_sample_reads() -> None:
    conversations = read_sharegpt(TRACES / "sample-sharegpt.json")
    assert len(conversations) == 20 and len({c.id for c in conversations}) == 20
    assert all(1 <= len(c.turns) <= 5 and c.turns[0][0] == "user" for c in conversations)
    assert any(c.system for c in conversations) and any(len(c.turns) % 2 for c in conversations)


BASE = {"id": "x", "conversations": _turns(("human", "Hi"), ("gpt", "Hello"))}


@pytest.mark.parametrize(("bad", "key", "says"), [
    ({"id": "y", "conversations": _turns(("human", "Hi"), ("robot", "beep"))}, "[1].conversations[1].from",
     '"robot" is not a role'),
    ({"id": "y", "conversations": _turns(("gpt", "I start"), ("human", "Hi"))}, "[1].conversations[0].from",
     "starts with a gpt turn"),
    ({"id": "y", "conversations": _turns(("human", "Hi"), ("human", "Again"))}, "[1].conversations[1].from",
     "two user turns in a row"),
    ({"id": "y", "conversations": _turns(("human", "Hi"), ("system", "late"))}, "[1].conversations[1].from",
     "a system turn after the first"),
    ({"id": "y", "conversations": _turns(("system", "only"))}, "[1].conversations", "only a system turn"),
    ({"id": "y", "conversations": [{"from": "human"}]}, "[1].conversations[0].value", "missing"),
    ({"id": "y", "conversations": _turns(("human", "   "))}, "[1].conversations[0].value", "an empty user turn"),
    ({"id": "y", "conversations": []}, "[1].conversations", "a non-empty list of turns"),
    ({"id": "y"}, "[1].conversations", "missing"),
    ({"id": ["y"], "conversations": _turns(("human", "Hi"))}, "[1].id", "expected a string"),
    ({"id": "x", "conversations": _turns(("human", "Hi"))}, "[1].id", "also conversation [0]'s id"),
    ("a string", "[1]", "expected a conversation"),
])
def test_each_bad_conversation_is_refused_at_its_line_with_its_key(tmp_path: Path, bad: object, key: str,
                                                                   says: str) -> None:
    path = _sharegpt(tmp_path, [BASE, bad])
    problem = _refusal(read_sharegpt, path).problems[0]
    # json.dumps(indent=1): "[" on line 1, the first conversation from line 2, the second after it
    second = path.read_text(encoding="utf-8").splitlines().index(" },") + 2
    assert (problem.file, problem.line, problem.path) == (str(path), second, key)
    assert says in problem.message


@pytest.mark.parametrize(("text", "line", "says"), [
    ('{"id": "x"}', 1, "expected a JSON list of conversations"),
    ('[\n {"id": "x", "conversations": []\n]', 3, "not JSON (Expecting ',' delimiter) in conversation [0]"),
    ('[\n {"id": "x"}\n {"id": "y"}\n]', 3, "expected ',' or ']' after conversation [0]"),
    ('[\n {"id": "x"}\n] []', 3, "text after the list"),
    ("", 1, "holds no conversations"),
    ("[]", 1, "holds no conversations"),
])
def test_a_document_that_is_not_a_list_of_conversations_is_refused_at_its_line(tmp_path: Path, text: str,
                                                                                line: int, says: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    problem = _refusal(read_sharegpt, path).problems[0]
    assert problem.line == line and says in problem.message, str(problem)


def test_a_sharegpt_file_above_the_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = _sharegpt(tmp_path, [BASE] * 100)
    message = str(_refusal(read_sharegpt, path, max_bytes=1000))
    assert message.startswith(f"{path}:1:1: ") and "is parsed whole" in message and "jq '.[:1000]'" in message
    assert len(read_sharegpt(_sharegpt(tmp_path, [BASE]), max_bytes=1000)) == 1
