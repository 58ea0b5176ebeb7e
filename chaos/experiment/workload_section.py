"""``load.workload:`` and the chat pass-through keys (``load.tools``, ``load.tool_choice``, ``load.reasoning``):
parsed and checked against the rest of the load and the target, every problem located, before any load is sent.

What is checked here and not at run time: a kind's keys given to another kind, keys that cannot work
together (tools with the completions endpoint, a rate beside a Mooncake trace whose timestamps are the
schedule), a trace that does not parse (its own file:line, at the experiment's ``path`` key), and lengths
a builtin target's ``max_model_len`` cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from chaos.model.experiment import FrozenMap, PromptSpec, TargetSpec, WorkloadSpec
from chaos.model.params import suggest
from chaos.model.units import parse_duration

from . import sections
from .parsing import _Context, _describe, _mapping, _parse
from .yamlpos import KeyPath

__all__ = ["chat_extras", "parse_workload"]

_TOOL_CHOICES = ("auto", "required", "none")


def parse_workload(ctx: _Context, raw: object, path: KeyPath, target: TargetSpec, load: Mapping[str, Any],
                   given: Mapping[str, Any], prompts: PromptSpec) -> WorkloadSpec:
    """``load.workload`` as a ``WorkloadSpec``; a wrong one: every problem added to ``ctx``, the default back.
    ``load``: the load section's values already parsed; ``given``: its keys as written."""
    if raw is None:
        return WorkloadSpec()
    data = _mapping(ctx, raw, path, "the workload section {kind, ...}")
    if data is None:
        return WorkloadSpec()
    kind = data.get("kind", "single")
    if kind not in sections.WORKLOAD_KINDS:
        ctx.add(path + ("kind",), f"unknown workload kind {kind!r}{suggest(str(kind), sections.WORKLOAD_KINDS)}; "
                f"kinds: {', '.join(sections.WORKLOAD_KINDS)}")
        return WorkloadSpec()
    schema = sections.WORKLOAD[kind]
    n = ctx.count
    for key in list(data):
        owners = [k for k, s in sections.WORKLOAD.items() if key in s.names() and key != "kind"]
        if key not in schema.names() and owners:
            ctx.add(path + (key,), f"only a workload of kind {' or '.join(owners)} takes {key!r} (this one is kind "
                    f"{kind}); set kind: {owners[0]}, or remove it", at="key")
            data.pop(key)
    values = _parse(ctx, data, path, schema, extra=("think_time",))
    if ctx.count > n:
        return WorkloadSpec(kind=kind)
    spec = WorkloadSpec(**{k: v for k, v in values.items() if v is not None and k in WorkloadSpec.__dataclass_fields__})
    if kind == "sessions":
        spec = _sessions(ctx, spec, data, path, target, load, prompts)
    elif kind == "shared_prefix":
        spec = _shared_prefix(ctx, spec, path, target, load, prompts)
    elif kind == "trace":
        spec = _trace(ctx, spec, path, target, load, given)
    return spec


def tokenizer_of(target: TargetSpec) -> tuple[str, str] | None:
    """Whose tokenizer the load can count with, as (target kind, model: ``tiny`` or the model directory,
    resolved), where this host has it (``chaos.load.workloads.tokens.tokenizer_file``, which the load process
    then loads for that kind and model); None elsewhere (an openai URL's model is only a name)."""
    import os
    from pathlib import Path

    from chaos.load.workloads.tokens import tokenizer_file

    if tokenizer_file(target) is None:
        return None
    model = str(target.model)
    return (target.kind, model if model == "tiny" else str(Path(os.path.expanduser(model)).resolve()))


def _context_tokens(target: TargetSpec) -> int | None:
    """The target's context length in tokens where the experiment says it (the builtin stack's)."""
    return target.max_model_len if target.kind == "builtin" else None


def _sessions(ctx: _Context, spec: WorkloadSpec, data: dict[str, Any], path: KeyPath, target: TargetSpec,
              load: Mapping[str, Any], prompts: PromptSpec) -> WorkloadSpec:
    think = _think_time(ctx, data.get("think_time"), path + ("think_time",))
    if prompts.source != "synthetic":
        ctx.add(("load", "prompts", "source"), "a sessions workload makes its user messages itself (their length "
                "from load.prompts min_chars/max_chars/mix): give source: synthetic, or use kind single for a file")
    spec = _with(spec, think_time=think, tokenizer=tokenizer_of(target))
    context = _context_tokens(target)
    max_tokens = load.get("max_tokens")
    if context is not None and isinstance(max_tokens, tuple):
        # replies alone: the last turn resends every earlier reply and needs room for its own
        need = spec.turns[1] * max_tokens[1]
        if need >= context:
            ctx.add(path + ("turns",), f"a session of up to {spec.turns[1]} turns can need {need} tokens for its "
                    f"replies alone ({spec.turns[1]} x max_tokens {max_tokens[1]}), more than the builtin target's "
                    f"max_model_len {context}: lower turns or load.max_tokens, or raise target.max_model_len")
    return spec


def _think_time(ctx: _Context, raw: object, path: KeyPath) -> tuple[float, float]:
    """A duration or ``[low, high]`` of durations, in seconds."""
    if raw is None:
        return (0.0, 0.0)
    items = raw if isinstance(raw, list) else [raw, raw]
    if len(items) != 2:
        ctx.add(path, f"expected a duration or [low, high] of durations, found {_describe(raw)}")
        return (0.0, 0.0)
    try:
        lo, hi = (float(parse_duration(x)) for x in items)
    except ValueError as exc:
        ctx.add(path, f"expected a duration or [low, high] of durations such as [2s, 10s]: {exc}")
        return (0.0, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or lo > hi:
        ctx.add(path, f"expected 0 <= low <= high, found [{lo:g}s, {hi:g}s]")
        return (0.0, 0.0)
    return (lo, hi)


def _shared_prefix(ctx: _Context, spec: WorkloadSpec, path: KeyPath, target: TargetSpec, load: Mapping[str, Any],
                   prompts: PromptSpec) -> WorkloadSpec:
    tokenizer = tokenizer_of(target)
    if spec.prefix_tokens is None and spec.prefix_chars is None:
        ctx.add(path, "a shared_prefix workload needs each prefix's length: prefix_tokens (with a target whose "
                "tokenizer is known: builtin, or a vllm model directory) or prefix_chars")
        return spec
    if spec.prefix_tokens is not None and tokenizer is None:
        ctx.add(path + ("prefix_tokens",), f"the {target.kind} target's tokenizer is not known here, so prompts "
                "cannot be made to a length in tokens; give prefix_chars instead")
        return spec
    if prompts.source != "synthetic":
        ctx.add(("load", "prompts", "source"), "a shared_prefix workload makes its prompts itself: give source: "
                "synthetic, or use kind single for a file")
    context = _context_tokens(target)
    max_tokens = load.get("max_tokens")
    if context is not None and spec.prefix_tokens is not None and isinstance(max_tokens, tuple):
        need = spec.prefix_tokens + max_tokens[1]
        if need >= context:
            ctx.add(path + ("prefix_tokens",), f"a prefix of {spec.prefix_tokens} tokens and up to {max_tokens[1]} "
                    f"generated need {need} tokens, more than the builtin target's max_model_len {context}: lower "
                    "prefix_tokens or load.max_tokens, or raise target.max_model_len")
    return _with(spec, tokenizer=tokenizer)


def _trace(ctx: _Context, spec: WorkloadSpec, path: KeyPath, target: TargetSpec, load: Mapping[str, Any],
           given: Mapping[str, Any]) -> WorkloadSpec:
    if spec.speed <= 0:
        ctx.add(path + ("speed",),
                f"must be greater than zero (1 = as recorded, 2 = twice as fast), found {spec.speed:g}")
        return spec
    raw_path = spec.path or ""
    resolved = (ctx.base_dir / raw_path).resolve()
    if not raw_path or not resolved.is_file():
        ctx.add(path + ("path",), f"trace file {raw_path!r} not found (relative to the experiment file); give a "
                f"{spec.layout} trace file (docs/workloads.md)")
        return spec
    spec = _with(spec, path=str(resolved), tokenizer=tokenizer_of(target), context_tokens=_context_tokens(target))
    if spec.layout == "mooncake" and given.get("rate") is not None:
        ctx.add(("load", "rate"), "a Mooncake trace's timestamps are its schedule: remove rate (use "
                "load.workload.speed to replay it faster or slower)", at="key")
    from chaos.model.errors import ExperimentInvalid

    try:
        if spec.layout == "mooncake":
            from chaos.load.workloads.trace import read_mooncake

            requests = read_mooncake(resolved, block_tokens=spec.block_tokens)
            _trace_fits(ctx, path, target, [(r.input_length, r.output_length) for r in requests])
        else:
            from chaos.load.workloads.trace import read_sharegpt

            read_sharegpt(resolved)
    except ExperimentInvalid as exc:
        for problem in exc.problems[:5]:  # the first few: a broken file says the same on every line
            ctx.add(path + ("path",), problem.message if problem.file == "<experiment>" else str(problem))
    return spec


def _trace_fits(ctx: _Context, path: KeyPath, target: TargetSpec, lengths: list[tuple[int, int]]) -> None:
    """Each Mooncake request's input and output within a builtin target's context."""
    context = _context_tokens(target)
    if context is None:
        return
    over = [(i, a, b) for i, (a, b) in enumerate(lengths, 1) if a + b > context]
    if over:
        i, a, b = over[0]
        ctx.add(path + ("path",), f"{len(over)} of the trace's {len(lengths)} requests need more tokens than the "
                f"builtin target's max_model_len {context} (the first, request {i}: input {a} + output {b}); raise "
                "target.max_model_len (up to 8192) or trim the trace")


def _with(spec: WorkloadSpec, **changes: Any) -> WorkloadSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def chat_extras(ctx: _Context, data: Mapping[str, Any], path: KeyPath, endpoint: str
                ) -> tuple[tuple[FrozenMap, ...], str | FrozenMap | None, bool | None]:
    """``load.tools``, ``load.tool_choice``, ``load.reasoning``: checked, frozen (passed through as given)."""
    tools: tuple[FrozenMap, ...] = ()
    raw_tools = data.get("tools")
    if raw_tools is not None:
        if not isinstance(raw_tools, list) or not all(_is_tool(t) for t in raw_tools):
            ctx.add(path + ("tools",), "expected a list of OpenAI tool definitions, each {type: function, function: "
                    "{name, description?, parameters?}}, found " + _describe(raw_tools))
        else:
            tools = tuple(FrozenMap(_plain_map(t)) for t in raw_tools)
    choice: str | FrozenMap | None = None
    raw_choice = data.get("tool_choice")
    if raw_choice is not None:
        if isinstance(raw_choice, str) and raw_choice in _TOOL_CHOICES:
            choice = raw_choice
        elif isinstance(raw_choice, Mapping) and _is_tool(raw_choice) and "name" in raw_choice["function"]:
            choice = FrozenMap(_plain_map(raw_choice))
        else:
            ctx.add(path + ("tool_choice",), f"expected auto, required, none or {{type: function, function: {{name: "
                    f"...}}}}, found {_describe(raw_choice)}{suggest(str(raw_choice), _TOOL_CHOICES)}")
        if raw_tools is None:
            ctx.add(path + ("tool_choice",), "tool_choice without tools: give load.tools too", at="key")
    reasoning = data.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, bool) else None  # anything else: the schema said so
    for key, value in (("tools", raw_tools), ("tool_choice", raw_choice), ("reasoning", reasoning)):
        if value is not None and endpoint != "chat":
            ctx.add(path + (key,), f"{key} is sent in chat requests only: set load.endpoint: chat", at="key")
    return tools, choice, reasoning


def _is_tool(value: object) -> bool:
    return (isinstance(value, Mapping) and value.get("type") == "function"
            and isinstance(value.get("function"), Mapping) and all(isinstance(k, str) for k in value))


def _plain_map(value: Mapping[str, Any]) -> dict[str, Any]:
    """A YAML mapping as plain dicts and lists, so it goes into JSON request bodies as written."""
    def plain(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    out: dict[str, Any] = plain(value)  # a mapping stays a mapping
    return out
