"""Two load shards, each in a network namespace of its own, driving one run against a target across a bridge.

This is the Kubernetes Indexed Job path (``load.shard_launch: external``) with real hosts' networking
stood in for by namespaces: each shard has its own interfaces, loopback and routing table, and
reaches the coordinator and the target only over a veth pair into a bridge the test creates (and
always removes). Nothing is bound to a wildcard address and nothing leaves the bridge: no default
route, no forwarding, no iptables. The run is coordinated over the bridge, the client rule of its
storm phase reaches both shards, both shards' records are merged into one population whose clocks
are aligned within the bounds the coordinator states, and the verdicts are the same ones a single
generator in the root namespace reaches with the same seed and load. The throughput of the merged
run beside the sum of the shards' own is printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chaos.api import runner as make_runner
from chaos.execution.result import Result
from chaos.experiment import experiment_from_dict
from chaos.load.shard_process import TOKEN_ENV, shard_journal_name
from chaos.model.observations import StreamRecord, from_json, iter_journal

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).parent / "held_streams_server.py"
SHARDS = 2
TOKENS, TICK_S = 16, 0.05  # 0.8 s a stream at one event per 50 ms: long-ish streams, cheap to serve


@dataclass(frozen=True)
class Net:
    """The test's network: a bridge in the root namespace and one namespace per shard behind it."""

    tag: str  # every link and namespace the test makes has it in its name
    host_ip: str  # the bridge's address: the coordinator and the target listen here only
    namespaces: tuple[str, ...]
    shard_ips: tuple[str, ...]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


def _leftovers(tag: str) -> list[str]:
    """Every link or namespace still named with ``tag``."""
    listed = _ip("-o", "link").stdout + _ip("netns", "list").stdout
    return [line for line in listed.splitlines() if tag in line]


def _free_subnet() -> int:
    """An X for 10.213.X.0/24 that no address or route of this host uses (chosen at random: two runs at once)."""
    used = {int(x) for x in re.findall(r"\b10\.213\.(\d+)\.", _ip("-o", "addr").stdout + _ip("route").stdout)}
    free = [x for x in range(1, 255) if x not in used]
    if not free:
        pytest.skip("every 10.213.X.0/24 is in use on this host")
    return free[secrets.randbelow(len(free))]


@contextlib.contextmanager
def bridged_namespaces(count: int) -> Iterator[Net]:
    """A bridge with 10.213.X.1/24 and ``count`` namespaces on it (10.213.X.10+k), removed on every exit path."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) here")
    probe = _ip("netns", "list")
    if probe.returncode != 0:
        pytest.skip(f"`ip netns` does not work here: {probe.stderr.strip()}")
    tag = "sc" + secrets.token_hex(3)  # "sc3fa9c1br": within the 15 characters a link name may have
    x = _free_subnet()
    bridge = f"{tag}br"
    net = Net(tag=tag, host_ip=f"10.213.{x}.1", namespaces=tuple(f"{tag}-ns{k}" for k in range(count)),
              shard_ips=tuple(f"10.213.{x}.{10 + k}" for k in range(count)))
    undo: list[tuple[str, ...]] = []  # run in reverse: each veth (and its peer) before its namespace, the bridge last

    def do(*args: str, undo_with: tuple[str, ...] | None = None) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            pytest.skip(f"cannot build the test's network (`ip {' '.join(args)}`): {done.stderr.strip()}")
        if undo_with is not None:
            undo.append(undo_with)

    try:
        do("link", "add", bridge, "type", "bridge", undo_with=("link", "del", bridge))
        do("addr", "add", f"{net.host_ip}/24", "dev", bridge)
        do("link", "set", bridge, "up")
        for k, (ns, ip) in enumerate(zip(net.namespaces, net.shard_ips, strict=True)):
            outside, inside = f"{tag}h{k}", f"{tag}n{k}"
            do("netns", "add", ns, undo_with=("netns", "del", ns))
            # deleting the root end removes the pair at once; a namespace's own links go only when the
            # kernel gets round to it, so the veth is deleted first and the leftover check is not racing it
            do("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns,
               undo_with=("link", "del", outside))
            do("link", "set", outside, "master", bridge, "up")
            do("-n", ns, "addr", "add", f"{ip}/24", "dev", inside)
            do("-n", ns, "link", "set", inside, "up")
            do("-n", ns, "link", "set", "lo", "up")
        yield net
    finally:
        for args in reversed(undo):
            _ip(*args)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def held_server(host: str) -> Iterator[int]:
    """The target: held_streams_server bound to ``host`` only; its port."""
    server = subprocess.Popen([sys.executable, str(SERVER), str(TOKENS), str(TICK_S), host], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # it prints once it listens: no waiting on a guess
        assert line.startswith("listening "), f"the target did not start: {line!r}"
        yield int(line.split()[1])
    finally:
        server.kill()
        server.wait(10)


def _experiment(url: str, allow: str, load: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "shards-netns", "seed": 13,
        "target": {"kind": "openai", "url": url},
        "load": {"concurrency": 16, "max_tokens": TOKENS, "request_timeout": "30s", **load},
        "phases": [
            # until decided, 4 s to 30 s: the held streams start in waves, so their TTFTs are correlated
            # in send order and how many are independent depends on the box (in one CI run a fixed 8 s,
            # 160 TTFTs, were worth 26.7 in the one-process run and 5.45 in the sharded one, too few to
            # bound a p50: inconclusive against pass). Each run now samples until its p50 is decided
            # (here 4-8 s, beside two busy processes too); the verdicts compared are the property
            {"name": "baseline", "duration": {"min": "4s", "max": "30s"}},
            {"name": "storm", "duration": "4s", "faults": [
                {"kind": "client.disconnect", "fraction": "50%", "after_tokens": 4},
            ]},
        ],
        "sla": [
            {"kind": "errors", "budget": "0%"},
            {"kind": "early_close", "budget": "0%"},
            {"kind": "ttft", "phases": ["baseline"], "quantile": "p50", "budget": "5s"},
        ],
        # a 10.x target is not this host's loopback: the run may act on exactly that address, nothing else
        "safety": {"max_duration": "2m", "cleanup_window": "300ms", "drain_timeout": "10s",
                   "allowed_targets": {"hosts": [allow]}},
    }


def _run(experiment: dict[str, Any], out: Path) -> Result:
    return asyncio.run(make_runner(experiment_from_dict(experiment), out_dir=out, handle_signals=False).run())


def _start_shard(net: Net, k: int, coordinator: str, token_file: Path, journal_dir: Path,
                 log: Path) -> subprocess.Popen[bytes]:
    """Shard ``k`` in its own namespace, started as a pod of an Indexed Job is: the token from a file."""
    env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}  # the file is its only way in
    env["PYTHONPATH"] = str(ROOT)
    with log.open("wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", net.namespaces[k], sys.executable, "-m", "chaos", "shard",
             "--coordinator", coordinator, "--index", str(k), "--count", str(SHARDS), "--token-file", str(token_file),
             "--journal-dir", str(journal_dir), "--connect-timeout", "120"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Each shard by its own pid: a closed one has exited already; one left behind is stopped."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _events_per_s(records: list[StreamRecord]) -> float:
    """SSE events received per second, over the span from the first send to the last end (one clock)."""
    sent = [r.t_sent for r in records if r.t_sent is not None]
    ended = [r.t_end for r in records if r.t_end is not None]
    span_ns = max(ended) - min(sent)
    return sum(r.events for r in records) / (span_ns / 1e9)


def _journal_records(path: Path) -> list[StreamRecord]:
    """A journal shard's stream records, on the shard's own clock."""
    out = []
    for body in iter_journal(path):
        if body.get("type") == "stream":
            record = from_json(body)
            assert isinstance(record, StreamRecord)
            out.append(record)
    return out


def _statuses(result: Result) -> list[tuple[str, str | None, str]]:
    return [(v.sla, v.phase, v.status) for v in result.verdicts]


def _runs(net: Net, token_file: Path, journals: Path, tmp_path: Path) -> tuple[Result, Result, str]:
    """Run A (two shards in the namespaces) and run B (one generator here), against one target on the bridge."""
    with held_server(net.host_ip) as port:
        url, allow = f"http://{net.host_ip}:{port}", f"{net.host_ip}:{port}"
        coordinator = f"{net.host_ip}:{_free_port(net.host_ip)}"
        sharded = _experiment(url, allow, {"shards": SHARDS, "shard_launch": "external", "shard_listen": coordinator,
                                           "shard_connect_timeout": "60s"})
        procs: list[subprocess.Popen[bytes]] = []
        try:
            # the shards first, as pods may start before the coordinator: each retries until it listens,
            # so nothing here waits on a guess of how long the runner's bring-up takes on a loaded host
            procs += [_start_shard(net, k, coordinator, token_file, journals, tmp_path / f"shard-{k}.log")
                      for k in range(SHARDS)]
            a = _run(sharded, tmp_path / "run-a")
        finally:
            _stop(procs)
        logs = [(tmp_path / f"shard-{k}.log").read_text(errors="replace")[-2000:] for k in range(SHARDS)]
        assert a.status == "completed", (a.error, logs)
        assert [p.returncode for p in procs] == [0] * SHARDS, logs
        # one generator in the root namespace, the same seed and load, against the same server
        b = _run(_experiment(url, allow, {"shards": 1}), tmp_path / "run-b")
        assert b.status == "completed", b.error
    return a, b, coordinator


def test_shards_in_their_own_network_namespaces_run_one_run_judged_as_one_process_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = secrets.token_urlsafe(32)
    monkeypatch.setenv(TOKEN_ENV, token)  # the coordinator's copy (the runner reads it for shard_launch external)
    token_file = tmp_path / "shard-token"
    token_file.touch(mode=0o600)
    token_file.write_text(token, encoding="utf-8")
    journals = tmp_path / "shard-journals"  # not the run directory: pods without a shared volume
    with bridged_namespaces(SHARDS) as net:
        a, b, coordinator = _runs(net, token_file, journals, tmp_path)
    assert not _leftovers(net.tag), "every link and namespace the test made is removed"

    streams = a.observations.population()
    assert {s.id.split("-")[0] for s in streams} == {"0", "1"}  # both shards' records, one population
    assert len({s.id for s in streams}) == len(streams)
    # the rule of the storm phase went over the bridge to both shards: each hung up on some of its streams
    hung_up = [s for s in streams if s.phase == "storm" and s.hangup is not None]
    assert {s.id.split("-")[0] for s in hung_up} == {"0", "1"}
    assert all(s.hangup is None for s in streams if s.phase == "baseline")

    (note,) = a.observations.notes_on("shards")
    shards = {s["index"]: s for s in note.data["shards"].values()}
    assert sorted(shards) == list(range(SHARDS)) and note.data["address"] == coordinator
    for k, shard in shards.items():
        assert shard["connected"] and shard["lost"] is None, shard
        # one host's monotonic clock in every namespace (namespaces do not virtualise it): the true offset is 0
        assert abs(shard["clock"]["offset_ns"]) <= shard["clock"]["bound_ns"], shard["clock"]
        assert abs(shard["drift_ns"]) <= shard["clock"]["bound_ns"] + shard["clock_end"]["bound_ns"], shard
        # nothing was lost on the way: every record the shard journaled also came live over the bridge
        assert shard["journal"] is None and shard["records_live"] == shard["records_written"] > 0, shard
        assert "records_missing" not in shard
        own = _journal_records(journals / shard_journal_name(k))
        assert {r.id for r in own} == {s.id for s in a.observations.streams if s.id.split("-")[0] == str(k)}

    ttft = [{k: v.evidence.get(k) for k in ("reason", "n_eff")} for r in (a, b) for v in r.verdicts if v.sla == "ttft"]
    assert _statuses(a) == _statuses(b), (_statuses(a), _statuses(b), ttft)
    assert a.ok, [v.to_dict() for v in a.failing()]

    # throughput, printed for `pytest -s` and never asserted: speed on a shared 2-core host is not a property
    merged = _events_per_s(a.observations.population())
    per_shard = [_events_per_s(_journal_records(journals / shard_journal_name(k))) for k in range(SHARDS)]
    single = _events_per_s(b.observations.population())
    load = os.getloadavg()
    spans = [f"{w.name} {((w.t_end or w.t_start) - w.t_start) / 1e9:.1f}s ({w.looks} looks, {w.stopped_by})"
             for r in (a, b) for w in r.observations.phases if w.name == "baseline"]
    print(f"\nbaseline, sharded and one process: {'; '.join(spans)}; ttft {ttft}")
    print(f"\nshards in namespaces: merged {merged:.0f} events/s; the shards' own "
          f"{' + '.join(f'{r:.0f}' for r in per_shard)} = {sum(per_shard):.0f} events/s; ratio "
          f"{merged / sum(per_shard):.3f}; one process (shards: 1) {single:.0f} events/s; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; clock offsets "
          + ", ".join(f"{s['clock']['offset_ns'] / 1e3:+.1f}±{s['clock']['bound_ns'] / 1e3:.1f}µs"
                      for s in shards.values()))
