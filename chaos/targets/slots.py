"""llama.cpp's slot states (``GET /slots``) read as series, for an engine that exports no KV usage.

llama.cpp's server removed its KV-cache metrics (``llamacpp:kv_cache_usage_ratio``,
``kv_cache_tokens``: "too internal") and serves ``/metrics`` only when started with ``--metrics``;
but ``/slots`` (on by default, ``--no-slots`` turns it off) lists every slot, each with
``is_processing``: a slot holds a request's KV cells while it processes one and is free again when
the request ends or is cancelled (``server_slot::release``). So the number of processing slots is
what a hang-up must bring back down, as ``kv_cleanup`` and ``abort_propagation`` ask of the KV
series of other engines, and it needs no flag on the server. A slot keeps its last prompt's cells
for reuse after it is released: that is the prompt cache, not a leak, and is not counted.

The samples are ``llamacpp_slots:processing`` (slots processing a request) and
``llamacpp_slots:total``, scraped on the run's metrics period by a ``MetricScraper`` whose answers
are JSON; the engine profile ``llamacpp`` names them (``chaos.model.engines``).
"""

from __future__ import annotations

import json
from typing import Any

from chaos.model.observations import MetricSample
from chaos.targets.scraper import MetricScraper

__all__ = ["PROCESSING", "TOTAL", "SlotScraper", "parse_slots", "slots_url"]

PROCESSING = "llamacpp_slots:processing"
TOTAL = "llamacpp_slots:total"


def slots_url(base_url: str) -> str:
    """``/slots`` of the server whose OpenAI root is ``base_url`` (``.../v1``). Pure."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/slots"


def parse_slots(text: str, t: int) -> list[MetricSample]:
    """``/slots``' JSON → the two samples, stamped ``t``; ValueError for anything but a list of slots. Pure."""
    try:
        slots: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"/slots is not JSON: {exc}") from exc
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise ValueError("/slots is not a list of slots")
    processing = sum(1 for s in slots if s.get("is_processing") is True)
    return [MetricSample(name=PROCESSING, labels={}, value=float(processing), t=t),
            MetricSample(name=TOTAL, labels={}, value=float(len(slots)), t=t)]


class SlotScraper(MetricScraper):
    """Polls ``/slots`` like ``/metrics``: the same period, failure notes and back-off for a 404/501."""

    def parse(self, text: str, t: int) -> list[MetricSample]:
        return parse_slots(text, t)
