from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

from chaos.stack.engine import Engine, EngineConfig, SamplingParams, TokenOutput


class Collector:
    """Gathers TokenOutputs per request (thread-safe) and signals when each finishes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outputs: dict[str, list[TokenOutput]] = {}
        self.done: dict[str, threading.Event] = {}

    def expect(self, rid: str) -> None:
        with self.lock:
            self.done.setdefault(rid, threading.Event())
            self.outputs.setdefault(rid, [])

    def __call__(self, out: TokenOutput) -> None:
        with self.lock:
            self.outputs.setdefault(out.request_id, []).append(out)
            ev = self.done.setdefault(out.request_id, threading.Event())
        if out.finished:
            ev.set()

    def tokens(self, rid: str) -> list[int]:
        return [t for o in self.outputs[rid] for t in o.token_ids]

    def final(self, rid: str) -> TokenOutput:
        return self.outputs[rid][-1]

    def wait(self, rids: Iterable[str], timeout: float = 20.0) -> None:
        for rid in rids:
            assert self.done[rid].wait(timeout), f"{rid} did not finish"


def make_engine(**kw) -> Engine:
    kw.setdefault("device", "cpu")
    eng = Engine(EngineConfig(**kw))
    eng.start()
    return eng


@pytest.fixture
def engine_factory():
    made: list[Engine] = []

    def factory(**kw) -> Engine:
        eng = make_engine(**kw)
        made.append(eng)
        return eng

    yield factory
    for eng in made:
        eng.shutdown(abort_all=True)


def run_all(engine: Engine, reqs: list[tuple[str, list[int], SamplingParams]], timeout: float = 30.0) -> Collector:
    col = Collector()
    for rid, prompt, params in reqs:
        col.expect(rid)
        engine.add_request(rid, prompt, params, col)
    col.wait([r[0] for r in reqs], timeout)
    return col


def prompts(engine: Engine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    base = ["Hello world", "今天天气很好", "def add(a, b):", "🚀 launch", "서버는 안정적", "The cache runs out",
            "日本語の文字", "Retry budgets protect"]
    return [tok.encode(f"{base[i % len(base)]} #{i}") for i in range(n)]


@pytest.fixture(name="run_all")
def _run_all_fixture():
    return run_all


@pytest.fixture(name="prompts")
def _prompts_fixture():
    return prompts


@pytest.fixture(name="Collector")
def _collector_fixture():
    return Collector
