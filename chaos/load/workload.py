"""What the load sends and when: seeded prompts, OpenAI request bodies, Gamma inter-arrival gaps.

Pure functions of a seed: the n-th request of a worker gets the same prompt, ``max_tokens`` and
client-fault draws in every run with that seed, whatever the timing, so a run replays.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from chaos.load.backoff import DEFAULT_CONNECT_BACKOFF
from chaos.load.text import SCRIPTS, synthetic_text
from chaos.load.workloads import WorkloadSettings, load_tokenizer
from chaos.model.errors import ExperimentInvalid

__all__ = [
    "LoadSettings",
    "LoadSpecLike",
    "LoadTarget",
    "Prompt",
    "PromptSettings",
    "PromptSpecLike",
    "Workload",
    "body_fields",
    "build_body",
    "endpoint_url",
    "gamma_gaps",
    "load_jsonl",
    "split_evenly",
    "streams_at_most",
    "synthetic_text",
]

class PromptSpecLike(Protocol):
    """What the generator reads of ``chaos.experiment.PromptSpec``."""

    @property
    def source(self) -> str: ...  # "synthetic" or a path to a JSONL file
    @property
    def min_chars(self) -> int: ...
    @property
    def max_chars(self) -> int: ...
    @property
    def mix(self) -> tuple[tuple[str, float], ...]: ...


class LoadSpecLike(Protocol):
    """What the generator reads of ``chaos.experiment.LoadSpec`` (a frozen dataclass)."""

    @property
    def endpoint(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def concurrency(self) -> int | None: ...
    @property
    def rate(self) -> float | None: ...
    @property
    def burstiness(self) -> float: ...
    @property
    def max_requests(self) -> int | None: ...
    @property
    def max_tokens(self) -> tuple[int, int]: ...
    @property
    def temperature(self) -> float: ...
    @property
    def ignore_eos(self) -> bool: ...
    @property
    def include_usage(self) -> bool: ...
    @property
    def request_timeout(self) -> float: ...
    @property
    def workers(self) -> int: ...
    @property
    def lag_threshold(self) -> float: ...
    @property
    def prompts(self) -> PromptSpecLike: ...
    @property
    def headers(self) -> tuple[tuple[str, str | None], ...]: ...


@dataclass(frozen=True)
class LoadTarget:
    """Where and as whom the load is sent: the API root (the proxy's when there is one), the model
    name requests carry, the run's seed (prompts, arrivals and client draws) and the API key."""

    base_url: str
    model: str
    seed: int
    api_key: str | None = field(default=None, repr=False)  # a secret: never printed
    # CA certificates (PEM text) the run trusts beyond the host's (chaos.host.tls.trusted(): the CA of what
    # the run serves over TLS itself), trusted by the load processes too: one TLS policy in every process
    ca_pems: tuple[str, ...] = field(default=(), repr=False)
    # the run's tag, the first 8 hex digits of each UUID-shaped request id (chaos.model.request_ids.run_tag); None:
    # one from the seed alone
    run_tag: int | None = None
    # the run's W3C trace id (32 hex digits, chaos.model.trace_ids): each request then sends a ``traceparent``
    # naming its stream's span under it (``--otlp``); None: no traceparent is sent
    trace_id: str | None = None


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain text (completions) or chat messages, with an optional reference answer."""

    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    expected_text: str | None = None
    tokens: int | None = None  # its length in the target's tokens, where a tokenizer made it (trace, shared_prefix)
    group: int | None = None  # shared_prefix: which prefix it begins with

    @property
    def chars(self) -> int:
        if self.text is not None:
            return len(self.text)
        return sum(len(str(m.get("content", ""))) for m in self.messages or ())

    def as_text(self) -> str:
        if self.text is not None:
            return self.text
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())

    def as_messages(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.text or ""}]


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from JSON lines: ``{"prompt": ...}`` or ``{"messages": [...]}``, optional ``expected_text``."""
    prompts: list[Prompt] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ExperimentInvalid(f"load.prompts.source: cannot read prompt file {str(path)!r}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ExperimentInvalid(f"{where}: not a JSON object ({exc}); expected {{\"prompt\": \"...\"}}") from None
        if not isinstance(obj, dict):
            raise ExperimentInvalid(f"{where}: expected a JSON object with \"prompt\" or \"messages\", found "
                                    f"{type(obj).__name__}")
        expected = obj.get("expected_text")
        if expected is not None and not isinstance(expected, str):
            raise ExperimentInvalid(f"{where}: \"expected_text\" must be a string")
        if isinstance(obj.get("prompt"), str):
            prompts.append(Prompt(text=obj["prompt"], expected_text=expected))
        elif (isinstance(obj.get("messages"), list)
              and all(isinstance(m, dict) and "content" in m for m in obj["messages"])):
            prompts.append(Prompt(messages=tuple(obj["messages"]), expected_text=expected))
        else:
            raise ExperimentInvalid(f"{where}: expected a string \"prompt\" or a list \"messages\" "
                                    "of {role, content} objects")
    if not prompts:
        raise ExperimentInvalid(f"load.prompts.source: {str(path)!r} holds no prompts; write one JSON object per line")
    return prompts


def endpoint_url(base_url: str, endpoint: str) -> str:
    """``http://h:p/v1`` + ``chat`` → ``http://h:p/v1/chat/completions``."""
    if endpoint not in ("completions", "chat"):
        raise ExperimentInvalid(f"load.endpoint: expected completions or chat, found {endpoint!r}")
    return base_url.rstrip("/") + ("/chat/completions" if endpoint == "chat" else "/completions")


def build_body(
    endpoint: str,
    model: str,
    prompt: Prompt,
    *,
    max_tokens: int,
    temperature: float,
    ignore_eos: bool,
    include_usage: bool,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAI streaming request body for ``endpoint``; ``extras``: chat-only fields (``chat_extras``)."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": temperature}
    if endpoint == "chat":
        body["messages"] = prompt.as_messages()
    else:
        body["prompt"] = prompt.as_text()
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM-compatible extension; the builtin stack honours it
    if extras and endpoint == "chat":
        body.update(extras)
    return body


def chat_extras(spec: LoadSpecLike) -> dict[str, Any]:
    """What a chat body carries besides its messages, passed through from the load: ``tools``,
    ``tool_choice``, and ``load.reasoning`` as ``chat_template_kwargs.enable_thinking`` (vLLM's switch
    for Qwen3-style templates; the builtin stack honours it). Empty when none is set."""
    out: dict[str, Any] = {}
    tools = getattr(spec, "tools", ())
    if tools:
        out["tools"] = [_plain(t) for t in tools]
    choice = getattr(spec, "tool_choice", None)
    if choice is not None:
        out["tool_choice"] = _plain(choice)
    reasoning = getattr(spec, "reasoning", None)
    if reasoning is not None:
        out["chat_template_kwargs"] = {"enable_thinking": bool(reasoning)}
    return out


def body_fields(spec: LoadSpecLike) -> dict[str, Any]:
    """The body fields every request of the load carries besides model, stream, prompt and max_tokens
    (``build_body``'s, for requests made elsewhere: sessions)."""
    body = build_body(spec.endpoint, "", Prompt(text=""), max_tokens=1, temperature=spec.temperature,
                      ignore_eos=spec.ignore_eos, include_usage=spec.include_usage, extras=chat_extras(spec))
    for key in ("model", "stream", "max_tokens", "prompt", "messages"):
        body.pop(key, None)
    return body


def _plain(value: Any) -> Any:
    """A frozen mapping (``FrozenMap``) or tuple as plain dicts and lists, for a JSON body."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def gamma_gaps(rng: random.Random, rate: float, burstiness: float = 1.0) -> Iterator[float]:
    """Inter-arrival gaps in seconds: Gamma(shape=burstiness, scale=1/(rate·burstiness)); 1 = Poisson."""
    if rate <= 0:
        raise ExperimentInvalid(f"load.rate: must be positive, found {rate!r}")
    if burstiness <= 0:
        raise ExperimentInvalid(f"load.burstiness: must be positive (1 = Poisson), found {burstiness!r}")
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


class Workload:
    """The request stream of one worker: ``request(n)`` is a pure function of (seed, worker, n)."""

    def __init__(self, spec: LoadSpecLike, *, model: str, seed: int, worker_index: int = 0) -> None:
        self.spec = spec
        self.model = model
        self.seed = seed
        self.worker_index = worker_index
        prompts = spec.prompts
        self._file: list[Prompt] | None = None
        if prompts.source != "synthetic":
            self._file = load_jsonl(prompts.source)
        self._scripts: Sequence[str] = [s for s, _ in prompts.mix] or ["ascii"]
        self._weights: Sequence[float] = [w for _, w in prompts.mix] or [1.0]
        for script in self._scripts:
            if script not in SCRIPTS:
                raise ExperimentInvalid(f"load.prompts.mix: unknown script {script!r}; use one of {', '.join(SCRIPTS)}")
        lo, hi = spec.max_tokens
        if not 1 <= lo <= hi:
            raise ExperimentInvalid(f"load.max_tokens: expected 1 <= low <= high, found [{lo}, {hi}]")
        self.url_path = "/chat/completions" if spec.endpoint == "chat" else "/completions"
        self.extras = chat_extras(spec)
        # the workload kinds that make each request alone (sessions hold a history: chaos.load.workloads.sessions)
        self.settings = WorkloadSettings.of(getattr(spec, "workload", None))
        self.kind = self.settings.kind
        self._tokenizer: Any = None
        self._shared: Any = None
        self._replay: Any = None

    @property
    def tokenizer(self) -> Any:
        """The target's tokenizer (``chaos.load.workloads.tokens``), loaded once, when a kind needs it."""
        if self._tokenizer is None and self.settings.tokenizer is not None:
            self._tokenizer = load_tokenizer(self.settings)
        return self._tokenizer

    def prepare(self) -> None:
        """Load what the kind needs before the load's clock starts (the tokenizer, a trace, the prefixes), so
        the first requests are not late by it (a Mooncake replay's send-time error)."""
        if self.kind == "shared_prefix":
            shared = self.shared_prefix()
            for group in range(min(self.settings.prefixes, 64)):
                shared.prefix(group)
        elif self.settings.timed and len(self.replay()):
            self.replay().prompt(0)  # builds the prompt maker's word table and its first blocks
        elif self.settings.conversational:
            _ = self.tokenizer

    def shared_prefix(self) -> Any:
        if self._shared is None:
            from chaos.load.workloads.shared_prefix import SharedPrefix

            self._shared = SharedPrefix(self.settings, seed=self.seed, worker_index=self.worker_index,
                                        tokenizer=self.tokenizer)
        return self._shared

    def replay(self) -> Any:
        """This worker's share of a Mooncake trace (``chaos.load.workloads.replay.MooncakeReplay``): every
        ``workers``-th request (``spec.workers``: the processes the load is split across)."""
        if self._replay is None:
            from chaos.load.workloads.replay import MooncakeReplay

            self._replay = MooncakeReplay(self.settings, seed=self.seed, worker_index=self.worker_index,
                                          workers=max(1, self.spec.workers), tokenizer=self.tokenizer)
        return self._replay

    def rng(self, n: int, purpose: str = "workload") -> random.Random:
        return random.Random(f"{self.seed}:{self.worker_index}:{n}:{purpose}")

    def prompt(self, n: int) -> Prompt:
        rng = self.rng(n)
        if self._file is not None:
            # each worker walks the file from a different offset so workers do not send in lockstep
            return self._file[(n * max(1, self.spec.workers) + self.worker_index) % len(self._file)]
        spec = self.spec.prompts
        chars = rng.randint(spec.min_chars, spec.max_chars)
        script = rng.choices(self._scripts, weights=self._weights)[0]
        return Prompt(text=synthetic_text(rng, chars, script))

    def request(self, n: int) -> tuple[dict[str, Any], Prompt]:
        """The body of this worker's n-th request and its prompt."""
        if self.settings.timed:  # the n-th request of this worker's share of the trace: its own output length
            text, tokens, max_tokens = self.replay().prompt(n)
            replayed = Prompt(text=text, tokens=tokens)
            return self._body(replayed, max_tokens), replayed
        lo, hi = self.spec.max_tokens
        max_tokens = self.rng(n, "max_tokens").randint(lo, hi)  # seeded per request: drawn where it is used
        if self.kind == "shared_prefix":
            prefix, suffix, group, tokens = self.shared_prefix().prompt(n)
            if self.spec.endpoint == "chat":
                prompt = Prompt(messages=({"role": "system", "content": prefix}, {"role": "user", "content": suffix}),
                                tokens=tokens, group=group)
            else:
                prompt = Prompt(text=prefix + suffix, tokens=tokens, group=group)
        else:
            prompt = self.prompt(n)
        return self._body(prompt, max_tokens), prompt

    def _body(self, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
        return build_body(
            self.spec.endpoint,
            self.model,
            prompt,
            max_tokens=max_tokens,
            temperature=self.spec.temperature,
            ignore_eos=self.spec.ignore_eos,
            include_usage=self.spec.include_usage,
            extras=self.extras,
        )


@dataclass(frozen=True)
class PromptSettings:
    """A plain, picklable copy of a PromptSpec (worker processes must not depend on the caller's class)."""

    source: str = "synthetic"
    min_chars: int = 64
    max_chars: int = 256
    mix: tuple[tuple[str, float], ...] = (("ascii", 1.0),)


@dataclass(frozen=True)
class LoadSettings:
    """A plain, picklable copy of a LoadSpec with the fields the generator reads."""

    endpoint: str = "completions"
    model: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    max_requests: int | None = None
    max_tokens: tuple[int, int] = (16, 16)
    temperature: float = 0.0
    ignore_eos: bool = True
    include_usage: bool = True
    request_timeout: float = 60.0
    workers: int = 1
    process: str = "runner"  # a library caller's generator runs where it is called (LoadSpec: own)
    lag_threshold: float = 0.005
    prompts: PromptSettings = PromptSettings()
    headers: tuple[tuple[str, str | None], ...] = ()  # over the SDK's default request headers (chaos.load.sdk_headers)
    request_ids: str = "uuid"  # each request's own X-Request-Id: uuid | sequence (chaos.model.request_ids)
    # a closed-loop slot's wait while nothing serves (chaos.load.backoff): (initial s, max s, multiplier);
    # None: a fixed 50 ms after a connect error only
    connect_backoff: tuple[float, float, float] | None = DEFAULT_CONNECT_BACKOFF
    workload: WorkloadSettings = WorkloadSettings()  # what the requests are (chaos.load.workloads)
    tools: tuple[dict[str, Any], ...] = ()  # passed through into chat bodies (chat_extras)
    tool_choice: Any = None  # a string or a {"type": "function", ...} mapping
    reasoning: bool | None = None
    # ``load.http`` (chaos.model.experiment.HttpSpec): 1.1 | 2 | auto, HTTP/2's streams per connection and
    # each stream's receive window in bytes
    http_version: str = "1.1"
    streams_per_connection: int = 100
    stream_window: int = 65_535
    # HTTP/1.1 connection reuse: auto | on | off. The runner turns auto into off before the load starts
    # where the keep-alive probe found the server closing connections after streams (chaos.load.keepalive)
    keep_alive: str = "auto"

    @classmethod
    def of(cls, spec: LoadSpecLike, **overrides: Any) -> LoadSettings:
        """Copy any LoadSpec-shaped object, replacing ``overrides``."""
        p = spec.prompts
        prompts = PromptSettings(str(p.source), int(p.min_chars), int(p.max_chars),
                                 tuple((str(s), float(w)) for s, w in p.mix))
        values: dict[str, Any] = {
            name: getattr(spec, name)
            for name in (
                "endpoint", "model", "concurrency", "rate", "burstiness", "max_requests", "max_tokens",
                "temperature", "ignore_eos", "include_usage", "request_timeout", "workers", "lag_threshold",
            )
        }
        values["process"] = str(getattr(spec, "process", "runner"))
        values["max_tokens"] = tuple(values["max_tokens"])
        values["prompts"] = prompts
        values["headers"] = tuple((str(k), None if v is None else str(v)) for k, v in spec.headers)
        values["request_ids"] = str(getattr(spec, "request_ids", "uuid"))
        backoff = getattr(spec, "connect_backoff", DEFAULT_CONNECT_BACKOFF)
        values["connect_backoff"] = None if backoff is None else tuple(float(x) for x in backoff)
        values["workload"] = WorkloadSettings.of(getattr(spec, "workload", None))
        values["tools"] = tuple(_plain(t) for t in getattr(spec, "tools", ()))
        values["tool_choice"] = _plain(getattr(spec, "tool_choice", None))
        values["reasoning"] = getattr(spec, "reasoning", None)
        http = getattr(spec, "http", None)
        if http is not None:  # a LoadSpec's HttpSpec; a LoadSettings carries the three as fields of its own
            values.update(http_version=str(http.version), streams_per_connection=int(http.streams_per_connection),
                          stream_window=int(http.window), keep_alive=str(getattr(http, "keep_alive", "auto")))
        else:
            values.update(http_version=str(getattr(spec, "http_version", "1.1")),
                          streams_per_connection=int(getattr(spec, "streams_per_connection", 100)),
                          stream_window=int(getattr(spec, "stream_window", 65_535)),
                          keep_alive=str(getattr(spec, "keep_alive", "auto")))
        values.update(overrides)
        return cls(**values)


def streams_at_most(spec: LoadSpecLike, inflight_cap: int) -> int:
    """The most streams the load holds open at once, over all its processes: its concurrency
    (closed loop), else what arrivals at ``rate`` can keep open for ``request_timeout``, never more
    than ``inflight_cap`` per worker process (open loop). Pure."""
    if spec.concurrency is not None:
        return spec.concurrency
    cap = inflight_cap * max(1, spec.workers)
    if WorkloadSettings.of(getattr(spec, "workload", None)).timed:
        return cap  # a trace's timestamps, not a rate, say how many may be open: its bound then
    return min(cap, math.ceil((spec.rate or 0.0) * spec.request_timeout) + 1)


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` integers differing by at most one, larger first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
