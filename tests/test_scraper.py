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
