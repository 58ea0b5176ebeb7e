"""`load.request_ids`: each request's X-Request-Id is UUID-shaped by default (llama-cpp-python answers HTTP 400
to any other), a bijection of the readable record id ("0-1362") and the run's tag; `sequence` sends the record
id itself. Taps read back pair with the streams by the record id, as they did with the old ids."""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path

import pytest

from chaos.execution.path import read_taps
from chaos.experiment import parse_experiment
from chaos.hops.streamhop.rules import request_key
from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.wire import settings_from_json, settings_to_json
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.load.workloads import WorkloadSettings
from chaos.model.context import ClientPolicy
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import StreamRecord, TapRecord, to_json
from chaos.model.request_ids import LABELS, RequestIds, is_uuid4, record_id_of, run_of, run_tag, wire_id
from chaos.survival.probe import DIMENSIONS

pytestmark = pytest.mark.timeout(60)

RUNS = (0, 0x1A2B3C4D, 2**32 - 1)
RECORD_IDS = (
    "0-0", "0-1362", "65535-0", "0-281474976710655", "65535-281474976710655",  # worker and number at both ends
    "3-s0-t1", "3-s12-t4", "65535-s4294967295-t65535-r4095", "1-s7-t2-r2",  # session turns and their resends
    "0-bg-1", "63-bg-281474976710655",  # a fault's background streams
    "preflight", "survival-baseline-1-000000", "survival-silence_keepalive-16777215-ffffff",
)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("record_id", RECORD_IDS)
def test_every_form_round_trips_as_a_strict_uuid4(record_id: str, run: int) -> None:
    wire = wire_id(record_id, run)
    parsed = uuid.UUID(wire, version=4)
    assert str(parsed) == wire and parsed.version == 4 and parsed.variant == uuid.RFC_4122, wire
    assert uuid.UUID(wire).version == 4 and is_uuid4(wire)  # not forced to version 4 by the constructor above
    assert record_id_of(wire) == record_id and run_of(wire) == run and wire.startswith(f"{run:08x}-")
    assert record_id_of(wire.upper()) == record_id  # a gateway that upper-cases it


def test_the_layout_is_the_documented_one() -> None:
    assert wire_id("0-1362", 0x1A2B3C4D) == "1a2b3c4d-0000-4000-8000-000000000552"
    assert wire_id("2-s5-t3-r1", 0x1A2B3C4D) == "1a2b3c4d-0002-4001-8001-000000050003"
    assert wire_id("0-bg-7", 1) == "00000001-0000-4002-8000-000000000007"


def test_every_survival_dimension_has_a_label() -> None:
    assert set(DIMENSIONS) | {"baseline"} <= set(LABELS)


@pytest.mark.parametrize(("record_id", "run", "fragment"), [
    ("65536-0", 1, "worker 65536 is out of range 0..65535"),
    ("0-281474976710656", 1, "request number 281474976710656 is out of range 0..281474976710655"),
    ("0-s4294967296-t1", 1, "session 4294967296 is out of range"),
    ("0-s1-t65536", 1, "turn 65536 is out of range"),
    ("0-s1-t1-r4096", 1, "resend 4096 is out of range"),
    ("survival-hold-16777216-abcdef", 1, "probe 16777216 is out of range"),
    ("survival-idle-1-abcdef", 1, "label 'idle' is none of"),
    ("0-1", -1, "run tag -1 is out of range 0..4294967295"),
    ("0-1", 2**32, "run tag 4294967296 is out of range"),
    ("0-01", 1, "has no UUID-shaped form"),  # a second spelling of 0-1 would not round-trip
    ("0-s1-t1-r0", 1, "has no UUID-shaped form"),
    ("0-bg-kv-1", 1, "has no UUID-shaped form"),
    ("anything", 1, "expected W-N, W-sK-tT[-rA], W-bg-C"),
])
def test_what_the_layout_cannot_hold_is_refused_by_name(record_id: str, run: int, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        wire_id(record_id, run)
    assert fragment in str(caught.value), caught.value


@pytest.mark.parametrize("foreign", [
    "0-1", "", "c3", "seq:4", "preflight-x", str(uuid.UUID(int=0)),
    "1a2b3c4d-0000-4000-8001-000000000552",  # form 000 never has an extra: not one we wrote
    "1a2b3c4d-0000-4000-9000-000000000552",  # variant 9: not ours
    "1a2b3c4d-0000-4fff-8000-000000000552",  # no such form
    "1a2b3c4d-0000-4004-8000-000000000001",  # a label with a number
    "1a2b3c4d-0000-4000-8000-000000000552 ",
])
def test_ids_that_are_not_ours_come_back_unchanged(foreign: str) -> None:
    assert record_id_of(foreign) == foreign and run_of(foreign) is None


def test_random_uuids_are_almost_never_taken_for_ours() -> None:
    # seeded, so the count is the same on every run: a random UUID4 is taken for ours about 6e-5 of the time
    # (a form nibble of 000-004 and variant 8 with the rest canonical), about 1 in 20,000
    rng = random.Random(20261205)
    made = (str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(20_000))
    ours = [u for u in made if record_id_of(u) != u]
    assert len(ours) <= 2, ours


def test_two_runs_differ_and_one_run_is_reproducible() -> None:
    assert run_tag(7, "run-a") == run_tag(7, "run-a")
    assert len({run_tag(7, "run-a"), run_tag(7, "run-b"), run_tag(8, "run-a")}) == 3
    assert wire_id("0-1", run_tag(7, "run-a")) != wire_id("0-1", run_tag(7, "run-b"))


def test_the_format_is_a_choice() -> None:
    assert RequestIds("sequence", 5).wire("0-1") == "0-1"
    assert RequestIds("uuid", 5).wire("0-1") == "00000005-0000-4000-8000-000000000001"
    with pytest.raises(ValueError, match="expected one of uuid, sequence"):
        RequestIds("uuid4")


def test_a_stream_hop_draws_a_request_alike_in_every_run() -> None:
    """Its rules' share decisions are seeded by the request id without the run's tag."""
    assert request_key(wire_id("0-5", 1), 1) == request_key(wire_id("0-5", 2), 9) != request_key(wire_id("0-6", 1), 1)
    assert request_key("0-5", 3) == "0-5" and request_key(None, 3) == "3"


# -- the experiment option, and where it travels ---------------------------------------------------------


def test_the_default_is_uuid_and_sequence_may_be_chosen() -> None:
    head = "name: r\nphases: [{name: a, duration: 1s}]\n"
    assert parse_experiment(head, "r.yaml").load.request_ids == "uuid"
    exp = parse_experiment(head + "load:\n  request_ids: sequence\n", "r.yaml")
    assert exp.load.request_ids == "sequence"
    settings = LoadSettings.of(exp.load)
    assert settings.request_ids == "sequence"
    assert settings_from_json(json.loads(json.dumps(settings_to_json(settings)))).request_ids == "sequence"


def test_a_wrong_format_is_located() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment("name: r\nphases: [{name: a, duration: 1s}]\nload:\n  request_ids: uuid4\n", "r.yaml")
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == ("r.yaml", 4, "load.request_ids"), problem
    assert "uuid" in problem.message and "sequence" in problem.message, problem


# -- real runs against a server that refuses ids that are not UUIDs ------------------------------------------


async def _run(server: ThreadedMockServer, spec: LoadSettings, run: int | None = 0x5EED) -> list[StreamRecord]:
    records: list[StreamRecord] = []
    gen = LoadGenerator(spec, LoadTarget(server.base_url, "mock", 1, run_tag=run), policy=ClientPolicy(),
                        sink=records.append)
    gen.phase = "p"
    await gen.run(time.monotonic_ns() + 5_000_000_000)
    await gen.drain(5)
    await gen.aclose()
    return records


async def test_the_default_is_served_by_a_server_that_wants_uuids() -> None:
    with ThreadedMockServer(uuid_request_ids=True) as server:
        records = await _run(server, LoadSettings(concurrency=2, max_requests=6, max_tokens=(3, 3),
                                                  request_timeout=10.0))
        seen = list(server.requests)
        refused = list(server.server.refused_ids)
    assert refused == [] and len(records) == 6 and all(r.error is None and r.status == 200 for r in records)
    sent = {r.id_header or "": r for r in seen}
    assert all(is_uuid4(w) and w.startswith("00005eed-") for w in sent), sorted(sent)
    assert sorted(record_id_of(w) for w in sent) == sorted(r.id for r in records) == [f"0-{n}" for n in range(6)]


async def test_sequence_sends_the_record_ids_and_such_a_server_refuses_every_one() -> None:
    with ThreadedMockServer(uuid_request_ids=True) as server:
        records = await _run(server, LoadSettings(concurrency=2, max_requests=4, max_tokens=(3, 3),
                                                  request_timeout=10.0, request_ids="sequence"))
        refused = list(server.server.refused_ids)
        served = len(server.requests)
    assert served == 0 and sorted(refused) == [f"0-{n}" for n in range(4)], refused
    assert len(records) == 4 and all(r.status == 400 for r in records), [r.status for r in records]


async def test_session_turns_go_out_uuid_shaped_too() -> None:
    spec = LoadSettings(endpoint="chat", concurrency=2, max_requests=6, max_tokens=(2, 2), request_timeout=10.0,
                        workload=WorkloadSettings(kind="sessions", turns=(3, 3)))
    with ThreadedMockServer(uuid_request_ids=True) as server:
        records = await _run(server, spec, run=None)
        sent = sorted(record_id_of(r.id_header or "") for r in server.requests)
        refused = list(server.server.refused_ids)
    assert refused == [] and records and all(r.error is None for r in records)
    assert sent == sorted(r.id for r in records) and all("-s" in i and "-t" in i for i in sent), sent


# -- taps: read back to the record id they stood for ------------------------------------------------------


def test_taps_are_read_back_to_the_record_id_with_the_wire_id_beside_it(tmp_path: Path) -> None:
    wire = wire_id("0-1362", 0x1A2B3C4D)
    foreign = str(uuid.uuid4())
    taps = [TapRecord(hop="x", seq=i + 1, request_id=rid, target="/v1/completions", t_accept=i)
            for i, rid in enumerate((wire, "0-7", foreign, None))]
    path = tmp_path / "x.taps.jsonl"
    path.write_text("".join(to_json(t) + "\n" for t in taps), encoding="utf-8")
    read = read_taps(path, "x").records
    assert [(t.request_id, t.wire_id) for t in read] == [("0-1362", wire), ("0-7", None), (foreign, None),
                                                         (None, None)]
