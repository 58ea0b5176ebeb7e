"""YAML text → plain Python data plus the line and column of every mapping key and value.

PyYAML's composer keeps a mark on every node; we walk the node tree ourselves so that each value
reached by a key path such as ``("phases", 1, "faults", 0, "jitter")`` keeps its position. Scalars
are built by PyYAML's safe constructor (so ``8``, ``0.5``, ``true`` and ``null`` mean what YAML says),
but mapping keys stay the text the user wrote (``on:`` is the key "on", not ``True``).
Structural mistakes the plain loaders swallow (duplicate keys, non-name keys, recursive aliases,
unsupported tags) come back as located problems instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["KeyPath", "Located", "Mark", "YamlSyntaxError", "load_located", "render_path"]

KeyPath = tuple[str | int, ...]

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAX_MERGE_DEPTH = 32


@dataclass(frozen=True)
class Mark:
    """A 1-based position in the YAML text."""

    line: int
    column: int


@dataclass
class Located:
    """The data of one YAML document and where each part of it was written."""

    data: Any
    keys: dict[KeyPath, Mark] = field(default_factory=dict)  # mapping entry → its key
    values: dict[KeyPath, Mark] = field(default_factory=dict)  # any node → its first character
    problems: list[tuple[KeyPath, Mark, str]] = field(default_factory=list)
    unreadable: set[KeyPath] = field(default_factory=set)  # reported here; their value is None


class YamlSyntaxError(Exception):
    """The text is not YAML; ``mark`` says where the parser gave up."""

    def __init__(self, mark: Mark, message: str) -> None:
        self.mark = mark
        self.message = message
        super().__init__(f"{mark.line}:{mark.column}: {message}")


def render_path(path: KeyPath) -> str:
    """``("phases", 1, "faults", 0, "jitter")`` → ``phases[1].faults[0].jitter``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def load_located(text: str) -> Located:
    """Parse one YAML document; raise ``YamlSyntaxError`` when the text is not YAML."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Mark(mark.line + 1, mark.column + 1) if mark else Mark(1, 1)
        what = exc.problem or exc.context or "unreadable YAML"
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        raise YamlSyntaxError(where, f"invalid YAML: {what}{context}") from None
    except yaml.reader.ReaderError as exc:
        raise YamlSyntaxError(_offset_mark(text, exc.position), f"invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(Mark(1, 1), f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlSyntaxError(Mark(1, 1), "invalid YAML: nested too deeply") from None
    located = Located(data=None)
    if root is None:
        return located
    walker = _Walker(located)
    try:
        located.data = walker.value(root, ())
    except RecursionError:
        located.problems.append(((), _mark(root), "the document is nested too deeply"))
        located.data = None
    return located


def _offset_mark(text: str, offset: int) -> Mark:
    before = text[:offset]
    return Mark(before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1)


def _mark(node: Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def _kind_of(node: Node) -> str:
    return "a mapping" if isinstance(node, MappingNode) else "a list" if isinstance(node, SequenceNode) else "a value"


class _Walker:
    """Builds plain data from composed nodes, recording marks and structural problems."""

    def __init__(self, located: Located) -> None:
        self.out = located
        self.constructor = yaml.SafeLoader("")  # only its scalar constructors are used
        self.active: set[int] = set()  # collections being walked: an alias back into one is a cycle

    def problem(self, path: KeyPath, node: Node, message: str) -> None:
        self.out.problems.append((path, _mark(node), message))

    def value(self, node: Node, path: KeyPath) -> Any:
        self.out.values.setdefault(path, _mark(node))
        if isinstance(node, ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            self.problem(path, node, "an alias refers to a collection that contains it (a cycle)")
            self.out.unreadable.add(path)
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    self.problem(path, node, f"YAML tag {node.tag!r} is not supported; write a plain list")
                return [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            if node.tag != _MAP_TAG:
                self.problem(path, node, f"YAML tag {node.tag!r} is not supported; write a plain mapping")
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: ScalarNode, path: KeyPath) -> Any:
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.problem(path, node, f"cannot read this value: {getattr(exc, 'problem', None) or exc}")
            self.out.unreadable.add(path)
            return None
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. `!!int abc`, `2024-13-45`
            tag = node.tag.rsplit(":", 1)[-1]
            self.problem(path, node, f"cannot read {node.value!r} as {tag}: {exc}")
            self.out.unreadable.add(path)
            return None

    def mapping(self, node: MappingNode, path: KeyPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            key = self.key(key_node, path)
            if key is None:
                continue
            if key in result:
                first = self.out.keys[path + (key,)]
                self.out.problems.append(
                    (path + (key,), _mark(key_node),
                     f"duplicate key {key!r} (first given at line {first.line}); give each key once")
                )
                continue
            self.out.keys[path + (key,)] = _mark(key_node)
            result[key] = self.value(value_node, path + (key,))
        # YAML merge keys (`<<: *defaults`): explicit keys win, earlier merge sources win over later.
        for key_node, value_node in self.merged_entries(merges, path, depth=0):
            key = self.key(key_node, path)
            if key is None or key in result:
                continue
            self.out.keys[path + (key,)] = _mark(key_node)
            result[key] = self.value(value_node, path + (key,))
        return result

    def merged_entries(self, sources: list[Node], path: KeyPath, depth: int) -> list[tuple[Node, Node]]:
        entries: list[tuple[Node, Node]] = []
        if depth > _MAX_MERGE_DEPTH:
            return entries
        flat: list[Node] = []
        for source in sources:
            if isinstance(source, SequenceNode):
                flat.extend(source.value)
            else:
                flat.append(source)
        for source in flat:
            if not isinstance(source, MappingNode):
                self.problem(path, source, f"a merge key (<<) needs a mapping or a list of mappings, found {_kind_of(source)}")
                continue
            nested = [v for k, v in source.value if k.tag == _MERGE_TAG]
            entries.extend((k, v) for k, v in source.value if k.tag != _MERGE_TAG)
            entries.extend(self.merged_entries(nested, path, depth + 1))
        return entries

    def key(self, node: Node, path: KeyPath) -> str | None:
        if isinstance(node, ScalarNode):
            return str(node.value)
        self.problem(path, node, f"a key must be a plain name, found {_kind_of(node)}")
        return None
