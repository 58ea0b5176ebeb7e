"""Between probes on a shared target the search waits until it is idle as `kv_cleanup` reads idle: no
request running and KV usage back down. A real local /metrics endpoint that drains on a schedule."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from chaos.capacity.probes import settle

pytestmark = pytest.mark.timeout(30)

Schedule = Callable[[float], tuple[int, float]]  # seconds since start -> (running, KV usage fraction)


@pytest.fixture
def draining() -> Iterator[Callable[[Schedule], str]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(schedule: Schedule) -> str:
        began = time.monotonic()

        class Metrics(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server naming
                running, usage = schedule(time.monotonic() - began)
                body = ("# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                        "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        f'vllm:kv_cache_usage_perc{{model_name="m"}} {usage}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_settle_waits_for_the_queue_to_drain_and_the_blocks_to_come_back(draining) -> None:
    # no idle level known yet: running until 1.0 s, its blocks freed with it; then at rest
    url = draining(lambda t: (2, 0.3) if t < 1.0 else (0, 0.1))
    rest = asyncio.run(settle(url, "vllm", 10.0))
    assert rest["running"] == 0 and rest["kv_usage"] == pytest.approx(0.1)
    assert 1.0 <= rest["waited_s"] < 5.0, rest


def test_settle_with_an_idle_level_waits_for_it_and_gives_up_at_its_timeout(draining) -> None:
    url = draining(lambda t: (0, 0.2 if t < 1.0 else 0.05))  # nothing running, the blocks freed late
    rest = asyncio.run(settle(url, "vllm", 10.0, idle_kv=0.05))
    assert rest["kv_usage"] == pytest.approx(0.05) and 1.0 <= rest["waited_s"] < 5.0, rest
    stuck = draining(lambda t: (0, 0.2))  # blocks never freed (the leak kv_cleanup exists for)
    rest = asyncio.run(settle(stuck, "vllm", 1.5, idle_kv=0.05))
    assert rest["kv_usage"] == pytest.approx(0.2) and rest["waited_s"] >= 1.5, rest


def test_settle_reads_nothing_when_there_is_nothing_to_read() -> None:
    assert asyncio.run(settle(None, "vllm", 10.0)) == {"waited_s": 0.0, "running": None, "kv_usage": None}


def test_the_idle_level_is_a_probe_runs_kv_usage_before_its_first_stream() -> None:
    from chaos.capacity.probes import pre_load_kv
    from chaos.model.observations import MetricSample, Observations, StreamRecord

    obs = Observations()
    for t, value in ((1, 0.04), (2, 0.02), (5, 0.6)):  # two scrapes before the load, one during it
        obs.metrics.append(MetricSample("vllm:kv_cache_usage_perc", {"model_name": "m"}, value, t))
    obs.streams.append(StreamRecord(id="0", phase="probe", t_sent=3))
    assert pre_load_kv(obs, "vllm") == pytest.approx(0.02)
    assert pre_load_kv(Observations(), "vllm") is None  # nothing sent: no baseline


def test_settle_does_not_read_an_oversized_exposition_whole(draining, monkeypatch: pytest.MonkeyPatch) -> None:
    """A /metrics answer past the byte cap is not parsed (nor held whole): the settle reads no
    figures from it and gives up at its timeout, as for a target that does not answer."""
    import chaos.capacity.probes as probes

    monkeypatch.setattr(probes, "METRICS_LIMIT", 64)  # the exposition below is ~150 bytes
    url = draining(lambda t: (0, 0.0))
    rest = asyncio.run(settle(url, "vllm", 1.0))
    assert rest["running"] is None and rest["kv_usage"] is None and rest["waited_s"] >= 1.0, rest
