"""Workload kinds beyond single requests: sessions, shared prefixes, trace replay (Mooncake, ShareGPT).

``load.workload.kind`` says which (docs/workloads.md):

- "single": one seeded prompt per request (``chaos.load.workload.Workload``), as before these kinds;
- ``sessions``: multi-turn conversations, each turn resending the whole history (``sessions``);
- ``shared_prefix``: P shared prefixes, each request one of them and a suffix of its own (``shared_prefix``);
- ``trace``: a Mooncake trace replayed at its timestamps (``replay``), or ShareGPT conversations
  replayed as sessions (``sessions``); the files are read by ``trace``, prompts made by ``tokens``.

``WorkloadSettings`` is the ``chaos.model.experiment.WorkloadSpec`` the load processes get (in
``LoadSettings.workload``), over pipes and the shard protocol's JSON alike: the same fields, with what
the kind implies and its JSON round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from chaos.model.experiment import WorkloadSpec

if TYPE_CHECKING:
    from chaos.load.workloads.tokens import TokenCounter

__all__ = ["WorkloadSettings", "load_tokenizer", "workload_line"]


@dataclass(frozen=True)
class WorkloadSettings(WorkloadSpec):
    """A ``WorkloadSpec`` as the load processes hold it: its fields (chaos/model/experiment.py), what the
    kind implies for the schedule and the sessions, and its JSON for the shard protocol."""

    @property
    def timed(self) -> bool:
        """A Mooncake trace: its timestamps are the schedule (no concurrency, no rate)."""
        return self.kind == "trace" and self.layout == "mooncake"

    @property
    def conversational(self) -> bool:
        """Requests made by a session that holds its history: sessions, and ShareGPT replays."""
        return self.kind == "sessions" or (self.kind == "trace" and self.layout == "sharegpt")

    @classmethod
    def of(cls, spec: Any) -> WorkloadSettings:
        """Copy a ``WorkloadSpec``-shaped object (None: the single kind)."""
        if spec is None:
            return cls()
        if isinstance(spec, cls):
            return spec
        return cls.from_json({f.name: getattr(spec, f.name) for f in fields(cls) if hasattr(spec, f.name)})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkloadSettings:
        """From its fields as JSON gives them back (lists for tuples); unknown keys ignored."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("turns", "suffix_chars"):
            if key in values:
                values[key] = tuple(int(x) for x in values[key])
        if "think_time" in values:
            values["think_time"] = tuple(float(x) for x in values["think_time"])
        if values.get("tokenizer") is not None:
            values["tokenizer"] = tuple(str(x) for x in values["tokenizer"])
        return cls(**values)


def load_tokenizer(settings: WorkloadSettings) -> TokenCounter | None:
    """The target's tokenizer the settings name (``tokenizer``: target kind and model), where this host has
    it; None: lengths in characters. Loaded in the load process itself (a tokenizer does not cross pipes)."""
    if settings.tokenizer is None:
        return None
    from chaos.load.workloads.tokens import target_tokenizer
    from chaos.model.experiment import TargetSpec

    kind, model = settings.tokenizer
    return target_tokenizer(TargetSpec(kind=kind, model=model))


def workload_line(spec: Any) -> str | None:
    """What a ``WorkloadSpec`` makes each request, in one line (the dry run's); None for single."""
    w = WorkloadSettings.of(spec)

    def span(pair: tuple[Any, Any], unit: str = "") -> str:
        return f"{pair[0]:g}{unit}" if pair[0] == pair[1] else f"{pair[0]:g}-{pair[1]:g}{unit}"

    counted = "counted in the target's tokenizer" if w.tokenizer else "no tokenizer known: lengths in characters"
    if w.kind == "sessions":
        return (f"workload: sessions of {span(w.turns)} turns, each resending the whole history; think time "
                f"{span(w.think_time, 's')}; a cut turn: {w.on_cut}"
                + (f"; a {w.system_chars}-character system message" if w.system_chars else "") + f" ({counted})")
    if w.kind == "shared_prefix":
        length = f"{w.prefix_tokens} tokens" if w.prefix_tokens is not None else f"{w.prefix_chars} characters"
        return (f"workload: {w.prefixes} shared prefixes of {length}, each request's own suffix "
                f"{span(w.suffix_chars)} characters")
    if w.kind == "trace":
        what = "requests at their timestamps" if w.timed else "conversations replayed as sessions"
        return f"workload: {w.layout} trace {w.path}, {what}, speed x{w.speed:g} ({counted})"
    return None
