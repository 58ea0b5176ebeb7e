"""Prometheus exposition parsing keeps the series verifiers read, under their full names."""

from chaos.targets.scraper import parse_exposition

TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 7.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e9
# TYPE http_requests gauge
http_requests 12
# TYPE sglang:token_usage gauge
sglang:token_usage 0.25
"""


def test_kept_series_and_labels() -> None:
    samples = {(s.name, s.value) for s in parse_exposition(TEXT, t=5)}
    assert samples == {("vllm:num_requests_running", 3.0), ("vllm:num_preemptions_total", 7.0),
                       ("sglang:token_usage", 0.25)}
    running = next(s for s in parse_exposition(TEXT, t=5) if s.name == "vllm:num_requests_running")
    assert running.labels == {"engine": "0", "model_name": "tiny"} and running.t == 5


def test_a_metrics_endpoint_that_answers_404_is_asked_rarely_and_a_failing_one_is_not() -> None:
    """Ten 404s in a row: the target has no metrics there, and the scraper asks every 5 s instead of
    every period (each ask cost the runner an HTTP request, 5 a second for the whole run). A 500 is a
    failure that may clear: it keeps the period. Real HTTP on 127.0.0.1, requests counted by the server."""
    import asyncio
    import threading
    from collections import Counter
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from chaos.model.observations import Note
    from chaos.output.progress import describe
    from chaos.targets.scraper import ABSENT_AFTER, ABSENT_INTERVAL_S, MetricScraper

    asked: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked[self.path] += 1
            self.send_response(404 if self.path == "/absent" else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    notes: list[object] = []

    async def scrape_both_for(seconds: float) -> None:
        scrapers = [MetricScraper(base + path, 0.05, notes.append) for path in ("/absent", "/broken")]
        for scraper in scrapers:
            scraper.start()
        await asyncio.sleep(seconds)
        for scraper in scrapers:
            await scraper.stop()

    try:
        asyncio.run(scrape_both_for(2.0))  # 40 periods; the 11th ask of /absent is 5 s after the 10th
    finally:
        server.shutdown()
        server.server_close()
    assert asked["/absent"] == ABSENT_AFTER, asked
    assert asked["/broken"] >= 25, asked
    tenth = [n for n in notes if isinstance(n, Note) and n.data["url"].endswith("/absent") and n.data["failures"] == 10]
    assert tenth and tenth[0].data["next_every_s"] == ABSENT_INTERVAL_S
    line = describe(tenth[0])  # the console says why the scrapes went quiet
    assert line is not None and f"asked every {ABSENT_INTERVAL_S:g}s from now" in line, line
    assert not any(isinstance(n, Note) and n.data["url"].endswith("/broken") and "next_every_s" in n.data
                   for n in notes)
