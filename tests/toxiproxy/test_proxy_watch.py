"""The run notices when its proxy changes behind its back (issue 41, point 1).

``watching_proxy`` reads the run's proxy back every second and halts the run when its upstream,
listen, enabled flag or toxics differ from what the run itself set (the ledger of ``chaos.toxiproxy.client``).
This matters most for a Toxiproxy that cannot be token-guarded (external, binary, container), and
still holds on the runner's own embedded server. Before it, an upstream pointed at someone's relay
and put back went unnoticed. ``tests/e2e/test_proxy_tamper.py`` has a whole run halted this way.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.execution import proxy
from chaos.execution.proxy import ProxyHandle, start_proxy, watching_proxy
from chaos.experiment import experiment_from_dict
from chaos.model.context import ProxyInfo, TargetInfo
from chaos.model.observations import Note
from chaos.toxiproxy.client import ProxyLedger, ToxiproxyAPI, drop_ledger, keep_ledger
from chaos.toxiproxy.server import ToxiproxyThread

pytestmark = pytest.mark.timeout(30)


def experiment(proxy: dict[str, Any]) -> Any:
    return experiment_from_dict({"name": "w", "proxy": proxy, "phases": [{"name": "a", "duration": "1s"}]})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Halts:
    """What the watch tells the runner: its ``halt`` calls and the notes it emits."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.notes: list[Note] = []

    def halt(self, reason: str) -> None:
        self.reasons.append(reason)

    def emit(self, event: Any) -> None:
        self.notes.append(event)

    async def first(self, within_s: float) -> str:
        deadline = time.monotonic() + within_s
        while not self.reasons:
            assert time.monotonic() < deadline, f"the watch did not halt within {within_s:g}s"
            await asyncio.sleep(0.05)
        return self.reasons[0]


async def the_runs_faults(handle: ProxyHandle, seconds: float) -> None:
    """Toxics added and removed, the link taken down and up, as the network faults do, for ``seconds``;
    the toxic is in force at the end."""
    api = ToxiproxyAPI(handle.info.api_url, handle.info.token)
    name, end = handle.info.proxy_name, time.monotonic() + seconds
    while True:
        await api.add_toxic(name, name="lat-downstream", type="latency", stream="downstream", toxicity=0.5,
                            attributes={"latency": 5, "jitter": 1})
        if time.monotonic() >= end:
            return  # with the toxic in force
        await api.set_enabled(name, False)
        await asyncio.sleep(0.2)
        await api.set_enabled(name, True)
        await asyncio.sleep(0.1)
        await api.remove_toxic(name, "lat-downstream")


def tamper(url: str, method: str, path: str, body: Any = None, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, json=body, headers=headers, timeout=5).status_code


def test_an_upstream_changed_behind_the_runs_back_halts_it_and_its_own_changes_do_not(tmp_path: Path) -> None:
    """An external Toxiproxy (no token possible): the run's own toxics and link toggles for 2.5 s
    halt nothing; another user's upstream change does, within about a second, naming both ends."""
    relay = f"127.0.0.1:{closed_port()}"

    async def scenario(url: str) -> tuple[Halts, str, str]:
        target = TargetInfo(kind="openai", base_url=f"http://127.0.0.1:{closed_port()}/v1")
        handle = await start_proxy(experiment({"server": "external", "url": url}), target, tmp_path)
        halts = Halts()
        try:
            async with watching_proxy(handle.info, halts.halt, halts.emit):
                await the_runs_faults(handle, 2.5)
                assert halts.reasons == [], halts.reasons  # the run's own changes are not a tamper
                status = await asyncio.to_thread(tamper, url, "POST", "/proxies/streamchaos", {"upstream": relay})
                assert status == 200  # an external Toxiproxy answers anyone
                started = time.monotonic()
                why = await halts.first(within_s=5.0)
                assert time.monotonic() - started < 3.0
        finally:
            await handle.stop()
        return halts, why, handle.info.upstream

    with ToxiproxyThread() as tpx:
        halts, why, upstream = asyncio.run(scenario(str(tpx.url)))
    assert f"proxy 'streamchaos' at {tpx.url} was changed by someone else" in why, why
    assert f"its upstream was changed from '{upstream}' to '{relay}'" in why and "SECURITY.md" in why, why
    halt_note = next(n for n in halts.notes if n.topic == "halt")
    assert halt_note.data["reason"] == why and halt_note.data["proxy_changes"], halt_note.data
    watch = next(n for n in halts.notes if n.topic == "proxy_watch")
    assert watch.data["reads"] >= 2 and watch.data["every_s"] == 1.0, watch.data


def test_a_toxic_edited_on_the_runs_own_embedded_server_halts_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's embedded server (guarded): the watch reads it with the run's token; a change
    made with that token (a toxic of the run's own faults edited to nothing) still halts the run."""
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)

    async def scenario() -> tuple[Halts, str, dict[str, int]]:
        target = TargetInfo(kind="openai", base_url=f"http://127.0.0.1:{closed_port()}/v1")
        handle = await start_proxy(experiment({"server": "embedded"}), target, tmp_path)
        halts = Halts()
        try:
            assert handle.info.server == "embedded" and handle.info.token
            async with watching_proxy(handle.info, halts.halt, halts.emit):
                await the_runs_faults(handle, 1.5)
                assert halts.reasons == [], halts.reasons
                status = await asyncio.to_thread(tamper, handle.info.api_url, "POST",
                                                  "/proxies/streamchaos/toxics/lat-downstream",
                                                  {"attributes": {"latency": 0}}, handle.info.token)
                assert status == 200
                why = await halts.first(within_s=5.0)
                denied = await asyncio.to_thread(tamper, handle.info.api_url, "GET", "/proxies/streamchaos")
        finally:
            await handle.stop()
        watch = next(n for n in halts.notes if n.topic == "proxy_watch")
        return halts, why, {"denied": denied, "unanswered": watch.data["unanswered"]}

    halts, why, seen = asyncio.run(scenario())
    assert "toxic 'lat-downstream' was changed" in why and "'latency': 0" in why, why
    assert seen == {"denied": 401, "unanswered": 0}  # the watch holds the token; others get nothing


TOXIC: dict[str, Any] = {"name": "t", "type": "latency", "stream": "downstream", "toxicity": 1,
                         "attributes": {"latency": 5, "jitter": 0}}
LISTED: dict[str, Any] = {"name": "p", "listen": "127.0.0.1:2000", "upstream": "127.0.0.1:3000", "enabled": True,
                          "toxics": [TOXIC]}


def ledger() -> ProxyLedger:
    book = ProxyLedger(upstream="127.0.0.1:3000", listen="127.0.0.1:2000")
    book.added_toxic("t", TOXIC)
    return book


@pytest.mark.parametrize(("change", "said"), [
    ({"upstream": "127.0.0.1:4444"}, "its upstream was changed from '127.0.0.1:3000' to '127.0.0.1:4444'"),
    ({"listen": "127.0.0.1:2001"}, "its listen was changed"),
    ({"enabled": False}, "it was disabled"),
    ({"toxics": []}, "toxic 't' was removed"),
    ({"toxics": [TOXIC, {"name": "x", "type": "bandwidth", "attributes": {"rate": 1}}]}, "toxic 'x' was added"),
    ({"toxics": [{**TOXIC, "toxicity": 0}]}, "toxic 't' was changed"),
    ({"toxics": [{**TOXIC, "attributes": {"latency": 0, "jitter": 0}}]}, "toxic 't' was changed"),
    ({"toxics": None}, "toxic 't' was removed"),
    ({"toxics": "none"}, "its toxics are listed as 'none'"),
])
def test_every_kind_of_change_is_named(change: dict[str, Any], said: str) -> None:
    assert ledger().differences(LISTED) == []
    assert said in "; ".join(ledger().differences({**LISTED, **change}))
    assert ledger().differences(None) == ["the proxy was deleted"]


def test_a_flood_of_changes_is_named_in_a_bounded_line() -> None:
    flood = [{"name": "x" * 10_000 + str(i), "type": "latency"} for i in range(1000)]
    said = ledger().differences({**LISTED, "upstream": "u" * 100_000, "toxics": [TOXIC, *flood]})
    assert len(said) == 9 and said[-1] == "and 993 more" and len("; ".join(said)) < 4000, said


def test_a_call_of_the_runs_own_in_flight_accepts_either_state() -> None:
    book = ledger()
    book.changing_toxic("t")
    book.changing_enabled()
    assert book.differences({**LISTED, "toxics": [], "enabled": False}) == []
    assert book.differences(LISTED) == []
    book.removed_toxic("t")
    book.set_enabled(False)
    assert book.differences({**LISTED, "enabled": False, "toxics": []}) == []
    assert "toxic 't' was added" in "; ".join(book.differences({**LISTED, "enabled": False}))


@pytest.mark.parametrize("attributes", ["x", [1, 2], 7])
def test_toxic_attributes_listed_as_no_object_are_a_change_never_a_crash(attributes: Any) -> None:
    said = "; ".join(ledger().differences({**LISTED, "toxics": [{**TOXIC, "attributes": attributes}]}))
    assert "toxic 't' was changed" in said and repr(attributes) in said, said  # before: dict("x") raised


def test_a_read_that_fails_oddly_is_counted_and_the_watch_reads_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """One listing whose handling raises something else than ``FaultError`` (here a bug's RuntimeError)
    is one unanswered read; the watch goes on and still halts on the tamper that follows (before: the
    watch task died silently at the first, and its exception came out of the run's teardown)."""
    info = ProxyInfo(api_url="http://127.0.0.1:9", proxy_name="p", listen="127.0.0.1:2000",
                     upstream="127.0.0.1:3000", server="external")
    answers: list[Any] = [RuntimeError("a bug"), {**LISTED, "toxics": [{**TOXIC, "attributes": "x"}]}]

    async def listing(self: ToxiproxyAPI, name: str) -> dict[str, Any]:
        answer = answers.pop(0) if answers else LISTED
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    monkeypatch.setattr(proxy, "WATCH_EVERY_S", 0.01)
    monkeypatch.setattr(ToxiproxyAPI, "listing", listing)

    async def scenario() -> Halts:
        halts = Halts()
        keep_ledger(info.api_url, info.proxy_name, ledger())
        try:
            async with watching_proxy(info, halts.halt, halts.emit):
                await halts.first(within_s=2.0)
        finally:
            drop_ledger(info.api_url, info.proxy_name)
        return halts

    halts = asyncio.run(scenario())
    assert "toxic 't' was changed" in halts.reasons[0], halts.reasons
    watch = next(n for n in halts.notes if n.topic == "proxy_watch")
    assert (watch.data["reads"], watch.data["unanswered"]) == (1, 1), watch.data
