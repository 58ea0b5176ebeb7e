"""llama.cpp's slot states as KV evidence (chaos.targets.slots): ``/slots`` parsed into the slots
processing a request, and ``kv_cleanup`` / ``abort_propagation`` judging them under the ``llamacpp``
profile: a slot left processing after every stream ended fails ``kv_cleanup``, slots freed pass it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sla
from chaos.model.engines import PROFILES
from chaos.targets.slots import PROCESSING, TOTAL, parse_slots, slots_url

pytestmark = pytest.mark.timeout(30)

# llama-server's answer (tools/server/server-context.cpp ``server_slot::to_json``), two of four fields kept
SLOTS = [{"id": 0, "n_ctx": 1024, "speculative": False, "is_processing": True, "id_task": 7},
         {"id": 1, "n_ctx": 1024, "speculative": False, "is_processing": False},
         {"id": 2, "n_ctx": 1024, "speculative": False, "is_processing": True, "id_task": 9},
         {"id": 3, "n_ctx": 1024, "speculative": False, "is_processing": False, "id_task": 3}]


def test_slots_parse_into_processing_and_total() -> None:
    samples = parse_slots(json.dumps(SLOTS), t=5)
    assert {s.name: s.value for s in samples} == {PROCESSING: 2.0, TOTAL: 4.0}
    assert all(s.t == 5 for s in samples)


@pytest.mark.parametrize("text", ["not json", '{"error": {"code": 501}}', "[1, 2]"])
def test_an_answer_that_is_no_slot_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_slots(text, t=0)


def test_the_slots_url_is_beside_the_openai_root() -> None:
    assert slots_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/slots"
    assert slots_url("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080/slots"
    assert slots_url("https://gw.example/llama") == "https://gw.example/llama/slots"


def _run(synth: Any, processing_after: float) -> Any:
    streams = [synth.stream(f"s{i}", phase="load", sent=1.0 + i * 0.2) for i in range(10)]
    end = max(float(st.t_end - synth.T0) / 1e9 for st in streams)

    def processing(t: float) -> float:
        return 0.0 if t < 1.0 else 3.0 if t < end else processing_after

    metrics = synth.steps(PROCESSING, 0.0, 10.0, 0.25, processing) + synth.steps(TOTAL, 0.0, 10.0, 0.25, lambda t: 4)
    notes = [synth.note("engine_profile", 0.0, profile=PROFILES["llamacpp"].describe(),
                        end={"finish_reason": True, "done": True})]
    return synth.obs(streams, metrics, notes=notes)


def test_a_slot_left_processing_fails_kv_cleanup(synth: Any) -> None:
    verdict = sla.judge(_run(synth, processing_after=1.0), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail", verdict
    assert verdict.evidence["usage_series"] == PROCESSING


def test_slots_freed_pass_kv_cleanup(synth: Any) -> None:
    verdict = sla.judge(_run(synth, processing_after=0.0), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "pass", verdict
    assert verdict.evidence["usage_series"] == PROCESSING
