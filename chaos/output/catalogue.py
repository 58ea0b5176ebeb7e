"""The fault, SLA and target catalogues, rendered from the registries for `streamchaos list` and the docs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.model.errors import ExperimentInvalid
from chaos.model.params import Param, Schema
from chaos.model.units import format_duration

__all__ = ["catalogue_markdown", "fault_kinds", "hop_kinds", "hops_markdown", "render_catalogue", "sla_kinds",
           "target_kinds"]

_WHATS = ("faults", "slas", "targets", "all")


@dataclass(frozen=True)
class _Kind:
    kind: str
    summary: str
    schema: Schema


def fault_kinds() -> list[_Kind]:
    """Every registered fault kind, sorted by name."""
    import faults  # noqa: F401  (importing the package registers every fault family)
    from faults.base import REGISTRY

    return [_Kind(k, getattr(c, "summary", ""), c.schema) for k, c in sorted(REGISTRY.items())]


def sla_kinds() -> list[_Kind]:
    """Every registered verifier kind, sorted by name."""
    import sla  # noqa: F401  (importing the package registers every verifier)
    from sla.base import REGISTRY

    return [_Kind(k, s.summary, s.schema) for k, s in sorted(REGISTRY.items())]


def target_kinds() -> list[_Kind]:
    """Every registered target kind, in list order; its parameters are the keys only it takes."""
    from chaos.targets.registry import kinds

    return [_Kind(k, c.summary, Schema(tuple(p for p in c.section.params if p.name in c.own_keys())))
            for k, c in kinds().items()]


def _target_common() -> str:
    from chaos.targets.base import COMMON_SECTION

    return f"target.kind; every kind also takes {', '.join(COMMON_SECTION.names())}"


def format_default(param: Param) -> str:
    """A parameter's default as one would write it in YAML; '' when there is none."""
    value = param.default
    if param.required or value is None:
        return ""
    return _format_value(param.kind, value)


# the kinds whose numbers are written with a unit
_NUMBER_FORMATS: dict[str, Callable[[float], str]] = {
    "duration": lambda v: format_duration(float(v)),
    "fraction": lambda v: f"{v * 100:g}%",
    "rate": lambda v: f"{v:g}/s",
    "data_rate": lambda v: f"{v:g}B/s",
    "size": lambda v: f"{v:g}B",
}


def _format_value(kind: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    number_format = _NUMBER_FORMATS.get(kind)
    if number_format is not None and isinstance(value, (int, float)):
        return number_format(value)
    if kind == "int_or_range" and isinstance(value, tuple) and len(value) == 2:
        return str(value[0]) if value[0] == value[1] else f"[{value[0]}, {value[1]}]"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value else '""'
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unit(param: Param) -> str:
    if param.kind == "choice":
        return "one of " + ", ".join(param.choices)
    unit = param.unit
    bounds = []
    if param.min is not None:
        bounds.append(f">= {_bound(param.kind, param.min)}")
    if param.max is not None:
        bounds.append(f"<= {_bound(param.kind, param.max)}")
    return f"{unit} ({', '.join(bounds)})" if bounds else unit


def _bound(kind: str, value: float) -> str:
    # Bounds are in base units; show them the way the value is written (10s, 1000B/s, 50%).
    if kind in ("duration", "fraction", "rate", "data_rate", "size"):
        return _format_value(kind, value)
    return f"{value:g}"


def _groups(schema: Schema) -> list[str]:
    lines = [f"exactly one of: {', '.join(g)}" for g in schema.one_of]
    lines += [f"at most one of: {', '.join(g)}" for g in schema.at_most_one_of]
    return lines


def _text_section(title: str, kinds: list[_Kind], common: str) -> str:
    lines = [f"{title} ({len(kinds)} kinds; {common})", ""]
    if not kinds:
        lines.append("  (none registered)")
    for k in kinds:
        lines.append(k.kind)
        if k.summary:
            lines.append(f"    {k.summary}")
        rows = [(p.name, _unit(p), "required" if p.required else format_default(p) or "-", p.doc)
                for p in k.schema.params]
        if rows:
            widths = [max(len(r[i]) for r in rows) for i in range(3)]
            for r in rows:
                cells = [r[i].ljust(widths[i]) for i in range(3)]
                lines.append(("    " + "  ".join(cells) + "  " + r[3]).rstrip())
        else:
            lines.append("    (no parameters)")
        lines.extend(f"    {g}" for g in _groups(k.schema))
        lines.append("")
    return "\n".join(lines)


_FAULT_COMMON = "every entry takes kind and an optional name"
_SLA_COMMON = ("every entry takes kind, and optionally name, phases, expect: pass|fail, turns (conversation turns "
               "judged: 2+, [1], docs/workloads.md) and when_unobservable: tolerate|inconclusive|fail (how a verdict "
               "the engine cannot show counts, docs/slas.md)")


def render_catalogue(what: str = "all") -> str:
    """`streamchaos list [faults|slas|targets|all]`: each kind, its summary and its parameters."""
    if what not in _WHATS:
        raise ExperimentInvalid(f"streamchaos list: expected one of {', '.join(_WHATS)}, found {what!r}")
    parts = []
    if what in ("faults", "all"):
        parts.append(_text_section("Faults", fault_kinds(), _FAULT_COMMON))
    if what in ("slas", "all"):
        from sla.definitions import definitions_text

        parts.append(_text_section("SLAs", sla_kinds(), _SLA_COMMON))
        parts.append(definitions_text())
    if what in ("targets", "all"):
        parts.append(_text_section("Targets", target_kinds(), _target_common()))
    return "\n".join(parts).rstrip() + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_section(title: str, kinds: list[_Kind], common: str, preface: str = "") -> str:
    lines = [f"## {title}", "", f"Generated from the registry ({common}).", ""]
    if preface:
        lines += [preface.rstrip(), ""]
    for k in kinds:
        lines.append(f"### `{k.kind}`")
        lines.append("")
        if k.summary:
            lines += [k.summary, ""]
        if k.schema.params:
            lines.append("| parameter | unit | default | required | description |")
            lines.append("| --- | --- | --- | --- | --- |")
            for p in k.schema.params:
                default = format_default(p)
                cells = [f"`{p.name}`", _unit(p), f"`{default}`" if default else "", "yes" if p.required else "", p.doc]
                lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        else:
            lines.append("No parameters.")
        groups = _groups(k.schema)
        if groups:
            lines += [""] + [f"- {g}" for g in groups]
        lines.append("")
    return "\n".join(lines)


def _definitions_md() -> str:
    from sla.definitions import definitions_markdown

    return (
        "### Metric definitions\n\n"
        "What each latency metric measures, from which stamps (`t_sent`: the request reached the socket; "
        "a token event: an SSE event with non-empty content, reasoning or a tool-call fragment, `t_tokens` every "
        "token event's stamp; without reasoning or tool calls, the content events), and what vLLM's `bench serve`, "
        "AIPerf and GuideLLM call the same figure (\"close\": same stamps up to where the clock starts or stops). "
        "`streamchaos report RUN_DIR --as vllm-bench` prints a run's figures under vLLM's names.\n\n"
        + definitions_markdown()
    )


def catalogue_markdown() -> str:
    """The "Fault catalogue" and "SLA catalogue" sections of docs/faults.md and docs/slas.md, exactly."""
    faults_md = _md_section("Fault catalogue", fault_kinds(), _FAULT_COMMON)
    slas_md = _md_section("SLA catalogue", sla_kinds(), _SLA_COMMON, _definitions_md())
    return (faults_md + "\n" + slas_md).rstrip() + "\n"


# what each hop kind that is not a gateway is, in the catalogue (a gateway says it itself)
_HOP_SUMMARIES = {
    "stream": ("the embedded SSE-aware proxy (`chaos/hops/streamhop/`): the `stream.*` faults act on it, and it "
               "taps what it received and what it forwarded, per request (`relay`, `abort_path`, early_close's "
               "`cut_at`)"),
    "toxiproxy": ("Toxiproxy (embedded, a binary, a container or one you run): the `network.*` faults act on it; "
                  "the old `proxy:` section is a path of this one hop"),
    "url": ("a gateway you already run, reached at `url`; what it forwards to is its own configuration's "
            "business, so it is the last hop of the path"),
}
_HOP_COMMON = "every hop takes kind and an optional name: the kind by default, `stream-2` for a second one"


def hop_kinds() -> list[_Kind]:
    """Every hop kind of ``path:``: stream, toxiproxy and url, then the gateways the run starts, each with
    the keys it takes besides kind and name (a gateway: its shipped configuration's options and ``config``)."""
    from chaos.experiment import sections
    from chaos.hops.gateways.base import gateway_kinds

    own = {"stream": sections.PATH_STREAM, "toxiproxy": sections.PATH_TOXIPROXY, "url": sections.PATH_URL}
    out = [_Kind(kind, _HOP_SUMMARIES[kind], _without(schema, sections.PATH_HOP_KEYS))
           for kind, schema in own.items()]
    config = Param("config", "str", None, doc="a configuration file of yours instead of the shipped one (relative to "
                                               "the experiment; a template: see Testing your own gateway)")
    for kind, cls in gateway_kinds().items():
        first = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        binary = Path(cls.binaries[0]).name
        summary = f"{first} Needs `{binary}`; where it is missing: {cls.install_hint}."
        out.append(_Kind(kind, summary, Schema((*cls.options.params, config))))
    return out


def _without(schema: Schema, names: tuple[str, ...]) -> Schema:
    return Schema(tuple(p for p in schema.params if p.name not in names))


def hops_markdown() -> str:
    """The "Hop kinds" section of docs/hops.md, exactly."""
    return _md_section("Hop kinds", hop_kinds(), _HOP_COMMON).rstrip() + "\n"
