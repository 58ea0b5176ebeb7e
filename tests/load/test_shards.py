"""Load shards: real `streamchaos shard` processes against a coordinator, a loopback mock target, merged.

Shards here are started the way pods of an Indexed Job start (``shard_launch: external``: the test
starts `python -m chaos shard ...` itself), so one of them can be given a clock that reads 7.5 s
behind, as a host booted at another time would. The mock server stamps each request's arrival on
the true clock of this host: after alignment, no request may be sent later than it arrived, beyond
the stated bound.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.load.mock import ThreadedMockServer
from chaos.load.shard_pool import ShardPool, merge_journal_shard
from chaos.load.shard_process import SKEW_ENV, TOKEN_ENV
from chaos.load.workload import LoadTarget
from chaos.model.client_rules import DisconnectRule
from chaos.model.context import ClientPolicy
from chaos.model.experiment import LoadSpec, PromptSpec
from chaos.model.observations import Note, StreamRecord
from chaos.model.request_ids import record_id_of, run_of

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

S = 1_000_000_000
SKEW_NS = -7_500_000_000  # shard 1's clock reads 7.5 s behind this host's
ROOT = Path(__file__).resolve().parents[2]


def _spec(**overrides: Any) -> LoadSpec:
    values: dict[str, Any] = {"concurrency": 4, "max_tokens": (4, 4), "request_timeout": 10.0, "shards": 2,
                              "shard_launch": "external", "shard_listen": "127.0.0.1:0", "shard_connect_timeout": 30.0,
                              "prompts": PromptSpec(min_chars=16, max_chars=32)}
    values.update(overrides)
    return LoadSpec(**values)


def _start_shard(address: str, index: int, journal_dir: Path, token: str, skew_ns: int = 0,
                 count: int = 2) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, SKEW_ENV)}
    env[TOKEN_ENV] = token
    if skew_ns:
        env[SKEW_ENV] = str(skew_ns)
    return subprocess.Popen(
        [sys.executable, "-m", "chaos", "shard", "--coordinator", address, "--index", str(index), "--count", str(count),
         "--journal-dir", str(journal_dir), "--connect-timeout", "20"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, "test-shard-token-0123456789")
    return "test-shard-token-0123456789"


@pytest.fixture
def mock_server() -> Iterator[ThreadedMockServer]:
    with ThreadedMockServer(tick_s=0.005) as server:
        yield server


async def _open(pool: ShardPool, shards: list[subprocess.Popen[str]], start: Any) -> None:
    """Open the pool while the test starts its shards (they retry until the coordinator listens)."""
    opening = asyncio.create_task(pool.open())
    while not pool.address:
        await asyncio.sleep(0.01)
    shards.extend(start(pool.address.replace("0.0.0.0", "127.0.0.1")))
    await opening


def _reap(shards: list[subprocess.Popen[str]]) -> list[str]:
    out = []
    for proc in shards:
        try:
            text, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate(timeout=5)
        out.append(text)
    return out


async def test_two_shards_with_skewed_clocks_merge_into_one_aligned_record_stream(
    tmp_path: Path, mock_server: ThreadedMockServer, token: str
) -> None:
    records: list[StreamRecord] = []
    notes: list[Note] = []
    policy = ClientPolicy()
    pool = ShardPool(_spec(), LoadTarget(mock_server.base_url, "m", 4), policy=policy, sink=records.append,
                     run_dir=tmp_path, notes=notes.append, run_id="run-1", lifetime_s=60)
    shards: list[subprocess.Popen[str]] = []
    try:
        await _open(pool, shards, lambda address: [_start_shard(address, 0, tmp_path, token),
                                                   _start_shard(address, 1, tmp_path, token, SKEW_NS)])
        await pool.ready()
        t_first = time.monotonic_ns()
        pool.phase = "one"
        await pool.run(time.monotonic_ns() + int(0.8 * S))
        # the runner's order at a phase boundary: phase, then rules, then the next run (one stream per shard: in order)
        pool.phase = "two"
        policy.install(DisconnectRule("dc", 1.0, after_tokens=(1, 1)))
        await pool.run(time.monotonic_ns() + int(0.8 * S))
        assert await pool.drain(10) == 0
        t_last = time.monotonic_ns()
    finally:
        await pool.aclose()
        outputs = _reap(shards)
    assert [p.returncode for p in shards] == [0, 0], outputs

    ids = [r.id for r in records]
    assert len(ids) == len(set(ids)) and {i.split("-")[0] for i in ids} == {"0", "1"}
    assert {r.phase for r in records} == {"one", "two"}
    assert all(r.hangup is not None and r.hangup.fault == "dc" for r in records if r.phase == "two")
    assert all(r.hangup is None for r in records if r.phase == "one")
    assert mock_server.server.max_active <= 4

    (note,) = notes
    by_index = {s["index"]: s for s in note.data["shards"].values()}
    skewed = by_index[1]["clock"]
    # the offset measured is the skew injected, within the bound stated for it
    assert abs(skewed["offset_ns"] - SKEW_NS) <= skewed["bound_ns"]
    assert abs(by_index[0]["clock"]["offset_ns"]) <= by_index[0]["clock"]["bound_ns"]
    assert by_index[1]["records_live"] + by_index[0]["records_live"] == len(records)
    assert by_index[1]["records_written"] == by_index[1]["records_live"] and by_index[1]["records_from_journal"] == 0
    assert by_index[0]["lost"] is None and by_index[1]["lost"] is None
    assert abs(by_index[1]["drift_ns"]) <= skewed["bound_ns"] + by_index[1]["clock_end"]["bound_ns"]

    # aligned: every stamp on this host's clock; no request sent after the server saw it arrive (beyond the bound)
    arrived = {record_id_of(r.id): r.t_start for r in mock_server.requests}  # sent UUID-shaped
    assert len({run_of(r.id) for r in mock_server.requests}) == 1  # every shard's ids carry the one run's tag
    for record in records:
        bound = by_index[int(record.id.split("-")[0])]["clock"]["bound_ns"]
        assert record.t_sent is not None and t_first - bound <= record.t_sent <= t_last + bound
        assert record.t_sent <= arrived[record.id] + bound, (record.id, arrived[record.id] - record.t_sent)
        assert record.t_end is not None and record.t_end <= t_last + bound

    # the journal shard keeps shard 1's own clock, and the offset beside it
    raw, why = merge_journal_shard(tmp_path / "journal.shard-1.jsonl", 0, set(), "run-1")
    assert why is None and raw and min(r.t_sent or 0 for r in raw) < t_first - 7 * S
    assert '"type":"clock"' in (tmp_path / "journal.shard-1.jsonl").read_text()
    assert merge_journal_shard(tmp_path / "journal.shard-1.jsonl", 0, set(), "another-run") == (
        [], "journal.shard-1.jsonl belongs to run 'run-1', not 'another-run'")


async def test_a_shard_with_the_wrong_token_is_refused_and_never_counted(tmp_path: Path,
                                                                         mock_server: ThreadedMockServer,
                                                                         token: str) -> None:
    pool = ShardPool(_spec(shards=2, shard_connect_timeout=4.0), LoadTarget(mock_server.base_url, "m", 1),
                     policy=ClientPolicy(), sink=lambda r: None, run_dir=tmp_path, run_id="r")
    shards: list[subprocess.Popen[str]] = []

    def start(address: str) -> list[subprocess.Popen[str]]:
        return [_start_shard(address, 0, tmp_path, token), _start_shard(address, 1, tmp_path, "not-the-token")]

    async def stranger() -> bytes:
        while not pool.address:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", int(pool.address.rsplit(":", 1)[1]))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not the protocol: hung up on, nothing said
        answer = await asyncio.wait_for(reader.read(), 15)
        writer.close()
        return answer

    talking = asyncio.create_task(stranger())
    with pytest.raises(Exception, match=r"only 1 of 2 load shards connected .* connected: \[0\]"):
        try:
            await _open(pool, shards, start)
        finally:
            await pool.aclose()
            outputs = _reap(shards)
    assert shards[1].returncode == 4 and "refused shard 1: wrong shard token" in outputs[1]
    assert await talking == b""
    assert not mock_server.requests  # nobody sent load


async def test_a_shard_stops_its_load_when_the_coordinator_vanishes_and_its_journal_fills_the_gap(
    tmp_path: Path, mock_server: ThreadedMockServer, token: str
) -> None:
    records: list[StreamRecord] = []
    notes: list[Note] = []
    pool = ShardPool(_spec(shards=2, concurrency=2), LoadTarget(mock_server.base_url, "m", 2), policy=ClientPolicy(),
                     sink=records.append, run_dir=tmp_path, notes=notes.append, run_id="r2", lifetime_s=60)
    shards: list[subprocess.Popen[str]] = []
    try:
        await _open(pool, shards, lambda address: [_start_shard(address, 0, tmp_path, token),
                                                   _start_shard(address, 1, tmp_path, token)])
        await pool.ready()
        pool.phase = "p"
        running = asyncio.create_task(pool.run(time.monotonic_ns() + 60 * S))  # far longer than the test
        await mock_server.until(lambda: len(mock_server.requests) >= 10, 20)
        for peer in pool._peers.values():  # the coordinator's host vanishes: its connections drop, no goodbye
            peer.writer.transport.abort()
        with pytest.raises(Exception, match="load shard"):
            await asyncio.wait_for(running, 20)
        outputs = _reap(shards)  # each shard notices, stops its load and exits on its own
        assert [p.returncode for p in shards] == [4, 4], outputs
        assert all("its load was stopped" in out for out in outputs), outputs
        sent = len(mock_server.requests)
        await asyncio.sleep(0.5)
        assert len(mock_server.requests) == sent  # nothing more arrives: no orphaned load
    finally:
        await pool.aclose()
    (note,) = notes
    from_file = sum(s["records_from_journal"] for s in note.data["shards"].values())
    assert from_file >= 1  # the streams cut short were journaled by the shards, never sent live, merged now
    assert len({r.id for r in records}) == len(records) \
        == sum(s["records_live"] for s in note.data["shards"].values()) + from_file


async def test_local_shards_reach_a_coordinator_listening_on_one_address_other_than_127_0_0_1(
    tmp_path: Path, mock_server: ThreadedMockServer
) -> None:
    # shard_listen names one address (a game-day host's 10.x, here 127.0.0.2: bound alone, not on 127.0.0.1);
    # local shards dialled 127.0.0.1 regardless and never connected
    records: list[StreamRecord] = []
    pool = ShardPool(_spec(shard_launch="local", shard_listen="127.0.0.2:0", shard_connect_timeout=30.0),
                     LoadTarget(mock_server.base_url, "m", 5), policy=ClientPolicy(), sink=records.append,
                     run_dir=tmp_path, run_id="r3", lifetime_s=60)
    try:
        await pool.open()
        assert pool.address.startswith("127.0.0.2:")
        await pool.ready()
        pool.phase = "p"
        await pool.run(time.monotonic_ns() + int(0.5 * S))
        assert await pool.drain(10) == 0
    finally:
        await pool.aclose()
    assert {r.id.split("-")[0] for r in records} == {"0", "1"}


async def test_shards_report_their_in_flight_streams_last_bytes_on_the_coordinators_clock(
    tmp_path: Path, token: str
) -> None:
    """What ``halt_on: target_down`` reads of streams still in flight: each shard reports when its
    open streams last got a byte, and the coordinator moves the stamps onto its own clock (the
    skewed shard's would read 7.5 s in the past otherwise)."""
    pool = None
    shards: list[subprocess.Popen[str]] = []
    with ThreadedMockServer(tick_s=0.1) as slow:  # 20 tokens at 100 ms: streams stay open ~2 s
        pool = ShardPool(_spec(max_tokens=(20, 20)), LoadTarget(slow.base_url, "m", 4), policy=ClientPolicy(),
                         sink=lambda record: None, run_dir=tmp_path, notes=lambda note: None, run_id="run-a",
                         lifetime_s=60)
        try:
            await _open(pool, shards, lambda address: [_start_shard(address, 0, tmp_path, token),
                                                       _start_shard(address, 1, tmp_path, token, SKEW_NS)])
            await pool.ready()
            pool.phase = "one"
            running = asyncio.create_task(pool.run(time.monotonic_ns() + S))
            stamps: list[int] = []
            for _ in range(100):  # until both shards have reported their 2 open streams each (bounded: 10 s)
                await asyncio.sleep(0.1)
                stamps = pool.last_activity()
                if len(stamps) >= 4:
                    break
            now = time.monotonic_ns()
            await running
            await pool.drain(15)
        finally:
            await pool.aclose()
            outputs = _reap(shards)
    assert [p.returncode for p in shards] == [0, 0], outputs
    assert len(stamps) >= 4, stamps
    # every stamp on this host's clock, recent: the skewed shard's too (a 100 ms tick, a 0.5 s report period)
    assert all(now - 2 * S <= t <= now + S // 10 for t in stamps), [(now - t) / S for t in stamps]


def _low_open_files(soft: int, hard: int | None = None) -> Any:
    """A child's RLIMIT_NOFILE as a host with the common soft limit has it (hard: lowered too, when given)."""
    import resource

    def apply() -> None:
        _, current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard if hard is not None else current_hard))

    return apply


async def test_an_external_shard_raises_its_own_open_file_limit_or_says_in_one_line_why_it_cannot(
    tmp_path: Path, mock_server: ThreadedMockServer, token: str
) -> None:
    """Issue 24: a shard pod inherits no limit the runner raised. The shard here holds 300 streams,
    one socket each, and 256 spare (556 files) under a soft limit of 64."""
    import json
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this host's hard open-file limit ({hard}) is below what the test raises to")

    def start(address: str, hard_limit: int | None) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, SKEW_ENV)} | {TOKEN_ENV: token}
        return subprocess.Popen(
            [sys.executable, "-m", "chaos", "shard", "--coordinator", address, "--index", "0", "--count", "1",
             "--journal-dir", str(tmp_path), "--connect-timeout", "20"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_low_open_files(64, hard_limit),
        )

    # the soft limit is raised to what the share needs, and the shard journal says so
    pool = ShardPool(_spec(shards=1, concurrency=300), LoadTarget(mock_server.base_url, "m", 1), policy=ClientPolicy(),
                     sink=lambda r: None, run_dir=tmp_path, run_id="fd")
    shards: list[subprocess.Popen[str]] = []
    try:
        await _open(pool, shards, lambda address: [start(address, None)])
        await pool.ready()
    finally:
        await pool.aclose()
        _reap(shards)
    first = json.loads((tmp_path / "journal.shard-0.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["type"] == "shard" and first["open_files"]["soft_before"] == 64, first
    assert first["open_files"]["soft"] >= first["open_files"]["needed"] == 556, first

    # a hard limit below that: the shard stops before any load with one line naming the fix
    (tmp_path / "journal.shard-0.jsonl").unlink()
    # the shard exits before it ever connects, so the pool's wait for it need not be long: 2 s, not the
    # 30 s this part took with a default-sized wait (it was the quick tier's slowest test)
    pool = ShardPool(_spec(shards=1, concurrency=300, shard_connect_timeout=2.0),
                     LoadTarget(mock_server.base_url, "m", 1), policy=ClientPolicy(), sink=lambda r: None,
                     run_dir=tmp_path, run_id="fd2")
    shards = []
    with pytest.raises(Exception, match="shard"):
        try:
            await _open(pool, shards, lambda address: [start(address, 128)])
            await pool.ready()
        finally:
            await pool.aclose()
            outputs = _reap(shards)
    assert shards[0].returncode == 4, outputs
    assert "needs about 556 open files" in outputs[0] and "Traceback" not in outputs[0], outputs
    assert not mock_server.requests  # nobody sent load
