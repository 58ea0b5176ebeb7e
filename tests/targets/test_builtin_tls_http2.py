"""`target: {kind: builtin, tls: true, http: 2}`: the stack a run starts serves HTTPS (the run's certificate
under <run dir>/tls, its CA trusted by the runner) and HTTP/2, and the runner's own clients reach it: the
readiness probe, a streaming request over h2, the metrics scraper, the admin client and the preflight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.admin.client import AdminClient
from chaos.execution.preflight import preflight
from chaos.experiment import experiment_from_dict
from chaos.host.tls import tls_context, trusted
from chaos.model.engines import PROFILES
from chaos.model.experiment import LoadSpec, TargetSpec
from chaos.model.observations import MetricSample, Note
from chaos.targets.base import BuiltinStack, builtin_http, builtin_tls, serve_args
from chaos.targets.registry import running_target
from chaos.targets.scraper import MetricScraper

pytestmark = pytest.mark.timeout(120)


def _target(**keys: Any) -> TargetSpec:
    data = {"name": "t", "target": {"kind": "builtin", "startup_timeout": "60s", **keys}, "load": {"concurrency": 1},
            "phases": [{"name": "p", "duration": "1s"}], "sla": [{"kind": "errors", "budget": "0%"}]}
    return experiment_from_dict(data).target


def test_the_target_keys_parse_and_reach_the_stack_command(tmp_path: Path) -> None:
    """YAML's bare numbers (`http: 2`, `http: 1.1`) are the versions they spell; the keys are the builtin
    kind's own; the stack is started with the run's files and --http 2."""
    plain, both = _target(), _target(tls=True, http=2)
    assert (builtin_tls(plain), builtin_http(plain)) == (False, "1.1")
    assert (builtin_tls(both), builtin_http(both)) == (True, "2")
    assert builtin_http(_target(http=1.1)) == "1.1" and builtin_http(_target(http="2")) == "2"
    args = serve_args(both, 0, 0, tls=None)
    assert args[-2:] == ["--http", "2"] and "--tls" not in args  # --tls comes with the files, at start()
    assert "--http" not in serve_args(plain, 0, 0)
    with pytest.raises(Exception, match=r"target.http: expected one of 1.1, 2"):
        _target(http=3)
    with pytest.raises(Exception, match=r"only a builtin target takes 'tls'"):
        _target(kind="openai", url="http://127.0.0.1:1/v1", tls=True)


async def test_a_builtin_target_with_tls_and_http2_serves_the_run_over_https_h2(tmp_path: Path) -> None:
    spec = _target(tls=True, http=2)
    async with running_target(spec, target_url=None, run_dir=tmp_path, seed=0) as target:
        assert isinstance(target, BuiltinStack)
        info = target.info
        assert info.base_url.startswith("https://127.0.0.1:") and info.base_url.endswith("/v1"), info.base_url
        assert info.metrics_url is not None and info.metrics_url.startswith("https://")
        assert info.device == "cpu"  # the readiness probe read /health over TLS
        ca = tmp_path / "tls" / "ca.pem"
        assert ca.is_file() and ca.read_text() in trusted()
        assert target.process is not None and target.process.ca is None  # the run's files, not a pair of its own
        assert f"--tls-cert {tmp_path / 'tls' / 'cert.pem'}" in " ".join(target.serve_args())

        async with httpx.AsyncClient(http2=True, verify=tls_context(("h2",)), timeout=30, trust_env=False) as client:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 8, "ignore_eos": True, "stream": True}
            async with client.stream("POST", info.base_url + "/completions", json=body) as response:
                assert response.http_version == "HTTP/2" and response.status_code == 200
                raw = await response.aread()
        events = [b[6:] for b in raw.split(b"\n\n") if b]
        assert events[-1] == b"[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"

        seen: list[MetricSample | Note] = []
        scraper = MetricScraper(info.metrics_url, 1.0, seen.append)
        try:
            assert await scraper.scrape_once() > 0, seen
        finally:
            await scraper.stop()
        async with AdminClient(info.admin_url or "", info.admin_token) as admin:
            assert (await admin.state())["connections"]["open"] >= 1

        result = await preflight(LoadSpec(max_tokens=(4, 4)), base_url=info.base_url, model="tiny", seed=0,
                                 api_key=None, profile=PROFILES["builtin"], timeout=30)
        assert result.record.error is None and result.record.token_events >= 1

        before = info.base_url
        await target.restart()  # the same port, the same certificate
        assert target.info.base_url == before
