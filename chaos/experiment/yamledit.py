"""Change values in YAML text in place: only the changed scalars' characters move.

``streamchaos budgets --write`` rewrites budget values in a user's experiment file; the file keeps
its comments, order, flow or block style and quoting because nothing is re-serialised. PyYAML's
composer gives every node its start and end offset in the text (the same marks the experiment
loader uses to locate problems), so a scalar is replaced by slicing, and a missing key is added
to its mapping in that mapping's style: ``, key: value`` before a flow mapping's ``}``, or a new
line at the block mapping's key column after its last entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from chaos.model.errors import UsageError

from .yamlpos import KeyPath, render_path

__all__ = ["apply_edits"]


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    text: str


def _compose(text: str, where: str) -> Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise UsageError(f"{where}: not readable YAML: {exc}") from None
    if root is None:
        raise UsageError(f"{where}: the file is empty")
    return root


def _child(node: Node, part: str | int, path: KeyPath, where: str) -> Node | None:
    if isinstance(part, int):
        if not isinstance(node, SequenceNode) or part >= len(node.value):
            raise UsageError(f"{where}: {render_path(path)} is not a list with an item {part}")
        return node.value[part]
    if not isinstance(node, MappingNode):
        raise UsageError(f"{where}: {render_path(path)} is not a mapping")
    for key, value in node.value:
        if isinstance(key, ScalarNode) and key.value == part:
            return value
    return None


def _scalar_text(node: ScalarNode, value: str) -> str:
    style = node.style if node.style in ("'", '"') else ""
    return f"{style}{value}{style}"


def _insert(text: str, mapping: MappingNode, key: str, value: str) -> _Edit:
    if mapping.flow_style:
        close = mapping.end_mark.index - 1
        if text[close] != "}":
            raise UsageError(f"cannot find the end of the mapping at line {mapping.start_mark.line + 1}")
        body = text[mapping.start_mark.index + 1:close].rstrip()
        sep = ", " if body.strip() else ""
        at = mapping.start_mark.index + 1 + len(body)
        return _Edit(at, at, f"{sep}{key}: {value}")
    if not mapping.value:
        raise UsageError(f"cannot add {key} to an empty block mapping at line {mapping.start_mark.line + 1}")
    column = mapping.value[0][0].start_mark.column
    last = mapping.value[-1][1]
    end = last.end_mark.index
    line = f"{' ' * column}{key}: {value}"
    if end > 0 and text[end - 1] == "\n":  # a nested block ends at the start of the next line
        return _Edit(end, end, line + "\n")
    line_end = text.find("\n", end)  # after the last value and any comment on its line
    if line_end < 0:
        return _Edit(len(text), len(text), "\n" + line)
    return _Edit(line_end, line_end, "\n" + line)


def apply_edits(text: str, edits: Mapping[KeyPath, str], where: str = "<yaml>") -> str:
    """``text`` with the scalar at each key path set to the YAML text given (a plain scalar such
    as ``250ms`` or ``97.5%``). A path whose last key is missing is added to its mapping."""
    root = _compose(text, where)
    planned: list[_Edit] = []
    for path, value in edits.items():
        node: Node = root
        for depth, part in enumerate(path[:-1]):
            child = _child(node, part, path[: depth + 1], where)
            if child is None:
                raise UsageError(f"{where}: {render_path(path[: depth + 1])} is missing")
            node = child
        last = path[-1]
        target = _child(node, last, path, where)
        if target is None:
            if not isinstance(node, MappingNode) or not isinstance(last, str):
                raise UsageError(f"{where}: cannot add {render_path(path)}")
            planned.append(_insert(text, node, last, value))
        elif isinstance(target, ScalarNode):
            planned.append(_Edit(target.start_mark.index, target.end_mark.index, _scalar_text(target, value)))
        else:
            raise UsageError(f"{where}: {render_path(path)} is not a single value")
    out = text
    for edit in sorted(planned, key=lambda e: e.start, reverse=True):  # from the end: offsets stay valid
        out = out[: edit.start] + edit.text + out[edit.end:]
    return out
