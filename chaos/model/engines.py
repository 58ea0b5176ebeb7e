"""Engine profiles: what each serving engine accepts, how its complete stream ends, where its metrics are.

A leaf module (it imports nothing of ours but the observation model), so the verifiers, the
scraper, the runner and the docs generator share one description per engine. ``identify`` is
the pure part of detection: it reads what the runner gathered at warm-up (``Evidence``: the server
header, ``/v1/models``' ``owned_by``, ``/version``, ``/info``, ``/health``, the metric names of one
scrape, the preflight's error text) and names a profile and why.

What each profile says, and where it comes from (read in the engines' own code and docs):

- ``vllm``: accepts ``ignore_eos``, ``min_tokens``, ``stream_options`` (vLLM's sampling
  extensions); ends every stream with ``data: [DONE]``, also after an in-band error event
  (reference llm-serving §2.5); ``/v1/models`` says ``owned_by: "vllm"``
  (``vllm/entrypoints/openai/protocol.py``, ``owned_by: str = "vllm"``); metrics ``vllm:*`` (§1.1).
- ``sglang``: the same request extensions, ``[DONE]`` after every stream (§2.6),
  ``owned_by: "sglang"`` (``sglang/srt/entrypoints/openai/protocol.py``), metrics ``sglang:*`` with
  ``--enable-metrics`` (§3.1: ``token_usage``, ``num_running_reqs``, ``num_queue_reqs``).
- ``tgi``: ``/info`` names its router (``text-generation-router``); OpenAI chunks then ``[DONE]``
  (§2.6); metrics ``tgi_*``, KV as ``tgi_batch_current_max_tokens`` of ``tgi_batch_max_total_tokens``
  (§3.3). ``ignore_eos`` is no TGI parameter and is not sent; ``stream_options`` is, and the
  preflight drops it if a TGI version refuses it.
- ``llamacpp``: llama.cpp's ``llama-server``: ``{"owned_by", "llamacpp"}`` in its model list
  (``tools/server``), honours ``ignore_eos``, ``data: [DONE]`` after the last chunk; metrics (with
  ``--metrics``) ``llamacpp:requests_processing`` / ``llamacpp:requests_deferred`` (ggml-org/llama.cpp
  commit a2df278 "update help metrics processing/deferred"). Its KV metrics
  (``llamacpp:kv_cache_usage_ratio``, ``kv_cache_tokens``) were removed (llama.cpp PRs #13660 and
  #22879, "too internal"; issue #23632 asks for them back), so ``kv_cleanup`` reads its slot states
  instead (``GET /slots``, on by default: the slots processing a request, ``chaos.targets.slots``).
- ``llama-cpp-python``: the server of the llama-cpp-python bindings (``python -m llama_cpp.server``,
  0.3.x): ``/v1/models`` says ``owned_by: "me"`` (``llama_cpp/server/app.py``); it takes ``ignore_eos``
  and ``stream_options`` and ignores both (the preflight names them); no ``/metrics``, no ``/slots``;
  by default (``interrupt_requests``) a request that waits for its one model lock ends the running
  stream with ``[DONE]`` and no finish_reason (measured: 99% of a 4-stream load's streams cut).
- ``transformers-serve``: Hugging Face's ``transformers serve`` (5.x): rejects any field outside the
  OpenAI schema with HTTP 422 ``Unexpected fields in the request: {...}``
  (``transformers/cli/serving/utils.py``, ``_validate_request``), accepts and ignores
  ``stream_options`` (``UNUSED_LEGACY_COMPLETION_FIELDS`` in ``completion.py``), ends each stream with
  a chunk carrying ``finish_reason`` and usage and **never sends ``[DONE]``** (measured, reference
  "Measured against real servers"), has no ``/metrics`` (404); ``owned_by`` is ``"local"`` for a
  local checkpoint (``utils.model_owner``), which other servers may say too, so the 422 is the sign.
- ``litellm``: the LiteLLM proxy (a gateway): ``GET /health/liveliness`` answers ``"I'm alive!"``
  (measured, 1.108), completions carry ``x-litellm-*`` headers (BerriAI/litellm
  ``docs/my-website/docs/proxy/response_headers.md``); it passes fields through to the engine behind
  it and sends ``[DONE]``; every route, ``/metrics`` included, wants the master key (``/metrics``
  answers 307 to ``/metrics/``). No KV series of its own: point ``target.metrics_url`` at the engine.
- ``openai``: any other OpenAI-compatible server: OpenAI's wire format (``[DONE]`` required),
  every known metric name tried in turn (the fallbacks that were global before profiles).
- ``builtin``: this project's stack: everything, ``streamchaos_*`` plus vLLM's names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos.model.observations import EndRule

__all__ = [
    "CONVENIENCE_FIELDS",
    "PROFILES",
    "EngineProfile",
    "Evidence",
    "RUNNING_SERIES",
    "USAGE_SERIES",
    "WAITING_SERIES",
    "identify",
    "profile",
]

# Fields the load adds only for convenience (exact lengths, usage counts): an engine that rejects
# one still serves the load without it, so the preflight drops it rather than failing the run.
CONVENIENCE_FIELDS: tuple[str, ...] = ("ignore_eos", "min_tokens", "stream_options")

# KV usage series: name → how ``kv_cleanup``'s tolerance applies ("exact" counts, "fraction" of the
# cache, or the name of a series holding the total the value is a share of).
Usage = tuple[tuple[str, str], ...]

_BUILTIN_USAGE: Usage = (("streamchaos_kv_blocks_used", "exact"),)
_VLLM_USAGE: Usage = (("vllm:kv_cache_usage_perc", "fraction"), ("vllm:gpu_cache_usage_perc", "fraction"))
_SGLANG_USAGE: Usage = (("sglang:token_usage", "fraction"),)
_TGI_USAGE: Usage = (("tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens"),)
_VLLM_RUNNING = ("vllm:num_requests_running",)
_SGLANG_RUNNING = ("sglang:num_running_reqs",)
_TGI_RUNNING = ("tgi_batch_current_size",)
# llama.cpp: its KV series are gone; the slots processing a request (``/slots``, read by
# chaos.targets.slots, no flag needed) stand in for KV held, and for running requests without --metrics
_LLAMACPP_SLOTS = "llamacpp_slots:processing"
_LLAMACPP_USAGE: Usage = ((_LLAMACPP_SLOTS, "exact"),)
_LLAMACPP_RUNNING = ("llamacpp:requests_processing", _LLAMACPP_SLOTS)

# Every name any profile knows, in the order a generic target tries them (the old global fallbacks).
USAGE_SERIES: Usage = _BUILTIN_USAGE + _VLLM_USAGE + _SGLANG_USAGE + _TGI_USAGE
RUNNING_SERIES: tuple[str, ...] = _VLLM_RUNNING + _SGLANG_RUNNING + _TGI_RUNNING + _LLAMACPP_RUNNING
WAITING_SERIES: tuple[str, ...] = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size",
                                   "llamacpp:requests_deferred")


@dataclass(frozen=True)
class EngineProfile:
    """What one serving engine accepts and how it behaves, as far as measuring it is concerned."""

    name: str  # the value of target.engine
    title: str  # how people call it
    accepts: frozenset[str]  # which CONVENIENCE_FIELDS it takes (the others are left out of requests)
    end: EndRule  # what a complete stream ends with
    usage_series: Usage = ()  # KV usage, first present wins
    running_series: tuple[str, ...] = ()
    waiting_series: tuple[str, ...] = ()
    metrics: bool = True  # whether it serves Prometheus metrics at all
    metric_prefixes: tuple[str, ...] = ()  # names that identify it in a scrape
    detection: str = ""  # how it is recognised, for the docs
    notes: str = ""  # anything a user should know, for the docs
    metrics_hint: str = ""  # what to do when its KV series are missing (kv_cleanup's inconclusive reason)
    gateway: bool = False  # a proxy in front of an engine: its metrics are the engine's, elsewhere
    slots: bool = False  # llama.cpp's /slots: its slot states are scraped as series (chaos.targets.slots)
    # whether a server of this kind may run without /metrics (a flag turns them on, or an unknown server): only
    # then is a /metrics that answers 404 "not observable on this engine"; else a setup to fix (inconclusive)
    metrics_optional: bool = True

    def describe(self) -> dict[str, Any]:
        """The profile as report.json and the journal keep it."""
        return {
            "name": self.name, "title": self.title, "accepts": sorted(self.accepts),
            "done_required": self.end.done, "finish_reason_required": self.end.finish_reason,
            "usage_series": [n for n, _ in self.usage_series], "running_series": list(self.running_series),
            "metrics": self.metrics, "metrics_hint": self.metrics_hint, "gateway": self.gateway,
            "slots": self.slots, "metrics_optional": self.metrics_optional,
        }


_ALL = frozenset(CONVENIENCE_FIELDS)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (
    EngineProfile(
        "builtin", "streamchaos builtin stack", _ALL, EndRule(),
        _BUILTIN_USAGE + _VLLM_USAGE, _VLLM_RUNNING, ("vllm:num_requests_waiting",),
        metric_prefixes=("streamchaos_",), detection='/health says "server": "streamchaos"', metrics_optional=False,
    ),
    EngineProfile(
        "vllm", "vLLM", _ALL, EndRule(), _VLLM_USAGE, _VLLM_RUNNING, ("vllm:num_requests_waiting",),
        metric_prefixes=("vllm:",), detection='/v1/models owned_by "vllm", /version, vllm:* metrics',
        metrics_optional=False,
    ),
    EngineProfile(
        "sglang", "SGLang", _ALL, EndRule(), _SGLANG_USAGE, _SGLANG_RUNNING, ("sglang:num_queue_reqs",),
        metric_prefixes=("sglang:",), detection='/v1/models owned_by "sglang", sglang:* metrics',
        notes="metrics need --enable-metrics", metrics_hint="start SGLang with --enable-metrics",
    ),
    EngineProfile(
        "tgi", "Text Generation Inference", frozenset({"stream_options"}), EndRule(), _TGI_USAGE, _TGI_RUNNING,
        ("tgi_queue_size",), metric_prefixes=("tgi_",),
        detection='/info router "text-generation-router", tgi_* metrics',
        notes="KV usage as batch tokens of the token budget", metrics_optional=False,
    ),
    EngineProfile(
        "llamacpp", "llama.cpp server", frozenset({"ignore_eos", "stream_options"}), EndRule(), _LLAMACPP_USAGE,
        _LLAMACPP_RUNNING, ("llamacpp:requests_deferred",), metric_prefixes=("llamacpp:",),
        detection='/v1/models owned_by "llamacpp", llamacpp:* metrics',
        notes="no KV usage series: KV held is read as the slots processing a request (/slots); "
              "running requests from llamacpp:requests_processing with --metrics, else the same slots",
        metrics_hint="llama.cpp exports no KV usage series and /slots did not answer: start it without "
                     "--no-slots, or name a series with `series`",
        slots=True,
    ),
    EngineProfile(
        "llama-cpp-python", "llama-cpp-python server", _ALL, EndRule(), metrics=False,
        detection='/v1/models owned_by "me"',
        notes="no /metrics and no /slots (kv_cleanup, abort_propagation unobservable); takes and ignores "
              "ignore_eos and stream_options; by default a new request cuts the running stream "
              "(--interrupt_requests False keeps it)",
        metrics_hint="llama-cpp-python's server exports no metrics and no slot states",
    ),
    EngineProfile(
        "transformers-serve", "transformers serve", frozenset({"stream_options"}), EndRule(done=False),
        metrics=False, detection='HTTP 422 "Unexpected fields in the request" at the preflight',
        notes="never sends [DONE]; rejects ignore_eos and min_tokens; no /metrics",
        metrics_hint="transformers serve exports no Prometheus metrics (no /metrics)",
    ),
    EngineProfile(
        "litellm", "LiteLLM proxy", _ALL, EndRule(), USAGE_SERIES, RUNNING_SERIES, WAITING_SERIES,
        metric_prefixes=("litellm_",), detection='/health/liveliness "I\'m alive!", x-litellm-* response headers',
        notes="a gateway: fields pass through to the engine behind it; its /metrics needs the key and has no KV series",
        metrics_hint="LiteLLM is a gateway with no KV series: set target.metrics_url to the engine behind it",
        gateway=True,
    ),
    EngineProfile(
        "openai", "generic OpenAI-compatible server", _ALL, EndRule(), USAGE_SERIES, RUNNING_SERIES, WAITING_SERIES,
        detection="anything else", notes="every known metric name is tried; the preflight drops rejected fields",
    ),
)}


def profile(name: str) -> EngineProfile:
    """The profile called ``name`` (KeyError when there is none)."""
    return PROFILES[name]


@dataclass(frozen=True)
class Evidence:
    """What the runner saw of a server at warm-up; every field may be missing (None / empty)."""

    server_header: str | None = None  # the ``Server`` header of /v1/models' answer
    headers: Mapping[str, str] = field(default_factory=dict)  # every header of /v1/models' answer, lower-case names
    owned_by: tuple[str, ...] = ()  # /v1/models data[].owned_by
    health: Mapping[str, Any] | None = None  # /health as JSON
    version: Mapping[str, Any] | None = None  # /version as JSON
    info: Mapping[str, Any] | None = None  # /info as JSON (TGI)
    metric_names: tuple[str, ...] = ()  # the series names of one scrape
    preflight_error: str | None = None  # the server's own text when the preflight was refused
    liveliness: str | None = None  # GET /health/liveliness (LiteLLM's liveness route answers "I'm alive!")


# llama-cpp-python's server lists its model as owned_by "me" (llama_cpp/server/app.py, /v1/models)
_OWNERS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "llama.cpp": "llamacpp",
           "me": "llama-cpp-python"}
_TRANSFORMERS_422 = re.compile(r"Unexpected fields in the request", re.IGNORECASE)


_Sign = tuple[EngineProfile, str] | None


def _builtin_sign(evidence: Evidence) -> _Sign:
    health = evidence.health or {}
    if str(health.get("server", "")).lower() == "streamchaos":
        return PROFILES["builtin"], '/health says "server": "streamchaos"'
    return None


def _litellm_sign(evidence: Evidence) -> _Sign:
    if any(name.startswith("x-litellm") for name in evidence.headers):
        first = next(n for n in sorted(evidence.headers) if n.startswith("x-litellm"))
        return PROFILES["litellm"], f"response header {first}"
    if evidence.liveliness is not None and "alive" in evidence.liveliness.lower():
        # litellm/proxy/health_endpoints: GET /health/liveliness answers "I'm alive!"
        return PROFILES["litellm"], f"/health/liveliness answered {evidence.liveliness.strip()!r}"
    return None


def _owner_sign(evidence: Evidence) -> _Sign:
    for owner in evidence.owned_by:
        if owner.lower() in _OWNERS:
            return PROFILES[_OWNERS[owner.lower()]], f'/v1/models owned_by "{owner}"'
    return None


def _tgi_sign(evidence: Evidence) -> _Sign:
    info = evidence.info or {}
    if "text-generation" in str(info.get("router", "")):
        return PROFILES["tgi"], f'/info router "{info.get("router")}"'
    return None


def _transformers_sign(evidence: Evidence) -> _Sign:
    if evidence.preflight_error and _TRANSFORMERS_422.search(evidence.preflight_error):
        return PROFILES["transformers-serve"], f"preflight refused with {evidence.preflight_error[:80]!r}"
    return None


def _metric_sign(evidence: Evidence) -> _Sign:
    for prof in PROFILES.values():
        hits = [n for n in evidence.metric_names if prof.metric_prefixes and n.startswith(prof.metric_prefixes)]
        if hits:
            return prof, f"metric {sorted(hits)[0]} in the first scrape"
    return None


def _llamacpp_sign(evidence: Evidence) -> _Sign:
    server = (evidence.server_header or "").lower()
    if "llama.cpp" in server:
        return PROFILES["llamacpp"], f"server header {evidence.server_header!r}"
    return None


def _vllm_version_sign(evidence: Evidence) -> _Sign:
    version = evidence.version or {}
    if isinstance(version.get("version"), str) and not evidence.owned_by:
        return PROFILES["vllm"], f"/version answered {version['version']!r}"
    return None


# most specific first
_SIGNS = (_builtin_sign, _litellm_sign, _owner_sign, _tgi_sign, _transformers_sign, _metric_sign, _llamacpp_sign,
          _vllm_version_sign)


def identify(evidence: Evidence) -> tuple[EngineProfile, str]:
    """The profile the evidence points to and why, most specific sign first; ``openai`` when none does. Pure."""
    for sign in _SIGNS:
        found = sign(evidence)
        if found is not None:
            return found
    return PROFILES["openai"], "no engine-specific sign (server header, owned_by, /version, /info, metric names)"
