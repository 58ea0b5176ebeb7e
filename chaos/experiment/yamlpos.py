"""YAML text → plain Python data plus the line and column of every mapping key and value.

PyYAML's composer keeps a mark on every node; we walk the node tree ourselves so that each value
reached by a key path such as ``("phases", 1, "faults", 0, "jitter")`` keeps its position. Scalars
are built by PyYAML's safe constructor (so ``8``, ``0.5``, ``true`` and ``null`` mean what YAML says),
but mapping keys stay the text the user wrote (``on:`` is the key "on", not ``True``).
Structural mistakes the plain loaders swallow (duplicate keys, non-name keys, recursive aliases,
unsupported tags) come back as located problems instead.

Every read is bounded by a ``Budget`` (text size, nodes as written, nodes after alias and merge-key
expansion, nesting depth, integer digits), so an alias bomb or a huge file costs a fraction of a
second and a few MB and ends in one located error instead of minutes, gigabytes and a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "DEFAULT_BUDGET",
    "Budget",
    "KeyPath",
    "Located",
    "Mark",
    "YamlSyntaxError",
    "YamlTooLarge",
    "load_bounded",
    "load_located",
    "offset_mark",
    "render_path",
]

KeyPath = tuple[str | int, ...]

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_MAX_MERGE_DEPTH = 32


@dataclass(frozen=True)
class Budget:
    """What one YAML read may cost. Real experiments are a few KB and a few hundred nodes.

    The limits are set by time: pure-Python PyYAML scans about 1 MiB/s of blank lines and composes
    about 40,000 flow-list items a second on a loaded 2-core VM, so 256 KiB and 10,000 nodes keep
    every read under a second whatever the text is.
    """

    max_bytes: int = 256 * 1024  # the text, as UTF-8
    max_nodes: int = 10_000  # nodes as written (an alias counts once)
    max_expanded: int = 10_000  # nodes reached through aliases and merge keys (what an alias bomb multiplies)
    max_depth: int = 64  # nested mappings and lists; an experiment needs about 6
    max_int_digits: int = 32  # a seed fits in 20; Python's int() of a long digit string is quadratic


DEFAULT_BUDGET = Budget()


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
    """The text is not YAML; ``mark`` says where the parser gave up (``path``: under which key, if known)."""

    def __init__(self, mark: Mark, message: str, path: KeyPath = ()) -> None:
        self.mark = mark
        self.message = message
        self.path = path
        super().__init__(f"{mark.line}:{mark.column}: {message}")


class YamlTooLarge(YamlSyntaxError):
    """The text is over a ``Budget`` limit; reading stopped where the limit was passed."""


def render_path(path: KeyPath) -> str:
    """``("phases", 1, "faults", 0, "jitter")`` → ``phases[1].faults[0].jitter``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def load_located(text: str, budget: Budget = DEFAULT_BUDGET) -> Located:
    """Parse one YAML document within ``budget``; raise ``YamlSyntaxError`` (or ``YamlTooLarge``)."""
    check_size(text, budget)
    try:  # the reader checks every character as it is built: a C0 control character fails here
        loader = _BoundedLoader(text, budget)
    except yaml.reader.ReaderError as exc:
        code = f"character U+{exc.character:04X}" if isinstance(exc.character, int) else "a character"
        raise YamlSyntaxError(offset_mark(text, exc.position),
                              f"invalid YAML: {code} is not allowed ({exc.reason})") from None
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Mark(mark.line + 1, mark.column + 1) if mark else Mark(1, 1)
        what = exc.problem or exc.context or "unreadable YAML"
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        raise YamlSyntaxError(where, f"invalid YAML: {what}{context}") from None
    except yaml.reader.ReaderError as exc:
        raise YamlSyntaxError(offset_mark(text, exc.position), f"invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(Mark(1, 1), f"invalid YAML: {exc}") from None
    except RecursionError:  # only below max_depth when the interpreter's stack is already deep
        raise YamlSyntaxError(Mark(1, 1), "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    located = Located(data=None)
    if root is None:
        return located
    walker = _Walker(located, budget)
    try:
        located.data = walker.value(root, ())
    except RecursionError:
        located.problems.append(((), _mark(root), "the document is nested too deeply"))
        located.data = None
    return located


def load_bounded(text: str, budget: Budget = DEFAULT_BUDGET) -> Any:
    """Plain data from YAML text, like ``yaml.safe_load`` but within ``budget``.

    Raises ``YamlSyntaxError`` for text that is not YAML, is over budget, or has structural problems
    (the first one, located).
    """
    located = load_located(text, budget)
    if located.problems:
        path, mark, message = located.problems[0]
        raise YamlSyntaxError(mark, message, path)
    return located.data


def check_size(text: str, budget: Budget = DEFAULT_BUDGET) -> None:
    """``YamlTooLarge`` located where the text passes ``budget.max_bytes`` (in UTF-8 bytes)."""
    if len(text) * 4 <= budget.max_bytes:  # cannot be over: a character is at most 4 bytes
        return
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) > budget.max_bytes:
        raise too_large(data, len(data), budget)


def too_large(head: bytes, size: int | None, budget: Budget) -> YamlTooLarge:
    """The error for a text over the size budget; ``head`` holds at least its first max_bytes bytes."""
    cut = head[: budget.max_bytes]
    line = cut.count(b"\n") + 1
    column = len(cut) - (cut.rfind(b"\n") + 1) + 1
    found = f"{_size(size)}" if size is not None else f"more than {_size(budget.max_bytes)}"
    return YamlTooLarge(
        Mark(line, column),
        f"the file is {found}; experiment files may be at most {_size(budget.max_bytes)} "
        "(reading stopped here) — split it, or move prompts to a prompts file",
    )


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.0f} KiB"
    return f"{n} bytes"


def offset_mark(text: str, offset: int) -> Mark:
    """The 1-based line and column of a character offset in ``text``."""
    before = text[:offset]
    return Mark(before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1)


def _mark(node: Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:python/name:os.system`` → ``!!python/name:os.system``, as the user wrote it."""
    prefix = "tag:yaml.org,2002:"
    return "!!" + tag[len(prefix):] if tag.startswith(prefix) else tag


def _kind_of(node: Node) -> str:
    return "a mapping" if isinstance(node, MappingNode) else "a list" if isinstance(node, SequenceNode) else "a value"


class _BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types: SafeLoader is Any here
    """PyYAML's safe composer, counting nodes and nesting as it goes (an alias is not expanded here)."""

    def __init__(self, text: str, budget: Budget) -> None:
        super().__init__(text)
        self.budget = budget
        self.nodes = 0
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        start = self.peek_event().start_mark
        self.depth += 1
        self.nodes += 1
        try:
            if self.depth > self.budget.max_depth:
                raise YamlTooLarge(
                    Mark(start.line + 1, start.column + 1),
                    f"nested more than {self.budget.max_depth} levels deep; an experiment needs fewer than 10",
                )
            if self.nodes > self.budget.max_nodes:
                raise YamlTooLarge(
                    Mark(start.line + 1, start.column + 1),
                    f"more than {self.budget.max_nodes} values (reading stopped here); "
                    "an experiment needs a few hundred — move prompts to a prompts file",
                )
            node: Node = super().compose_node(parent, index)
            return node
        finally:
            self.depth -= 1


class _Walker:
    """Builds plain data from composed nodes, recording marks and structural problems."""

    def __init__(self, located: Located, budget: Budget = DEFAULT_BUDGET) -> None:
        self.out = located
        self.budget = budget
        self.expanded = 0  # nodes visited, aliases expanded: what an alias bomb multiplies
        self.constructor = yaml.SafeLoader("")  # only its scalar constructors are used
        self.active: set[int] = set()  # collections being walked: an alias back into one is a cycle

    def spend(self, path: KeyPath, node: Node, n: int = 1) -> None:
        """Count ``n`` nodes against the expansion budget; stop the whole read when it is spent."""
        self.expanded += n
        if self.expanded > self.budget.max_expanded:
            raise YamlTooLarge(
                _mark(node),
                f"aliases (*name) and merge keys (<<) expand the document to more than "
                f"{self.budget.max_expanded} values (an alias bomb?); write the values out, or use fewer aliases",
                path,
            )
        if len(path) > self.budget.max_depth:
            raise YamlTooLarge(_mark(node), f"aliases nest the document more than {self.budget.max_depth} levels deep",
                               path)

    def problem(self, path: KeyPath, node: Node, message: str) -> None:
        self.out.problems.append((path, _mark(node), message))

    def value(self, node: Node, path: KeyPath) -> Any:
        self.spend(path, node)
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
                    self.problem(path, node, f"YAML tag {_short_tag(node.tag)} is not supported; "
                                     f"write a plain list without the tag")
                return [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            if node.tag != _MAP_TAG:
                self.problem(path, node, f"YAML tag {_short_tag(node.tag)} is not supported; "
                                     f"write a plain mapping without the tag")
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: ScalarNode, path: KeyPath) -> Any:
        if node.tag == _INT_TAG and len(node.value) > self.budget.max_int_digits:
            self.problem(path, node, f"an integer of {len(node.value)} characters; at most "
                                     f"{self.budget.max_int_digits} are read (a seed needs 20)")
            self.out.unreadable.add(path)
            return None
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # a tag the safe constructor does not know: `!!python/...`, `!custom`
            self.problem(path, node, f"cannot read this value: {getattr(exc, 'problem', None) or exc}; "
                                     f"write the plain value without the tag {_short_tag(node.tag)}")
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
                self.problem(path, source,
                             f"a merge key (<<) needs a mapping or a list of mappings, found {_kind_of(source)}")
                continue
            self.spend(path, source, len(source.value))  # merged entries are copies, like alias expansion
            nested = [v for k, v in source.value if k.tag == _MERGE_TAG]
            entries.extend((k, v) for k, v in source.value if k.tag != _MERGE_TAG)
            entries.extend(self.merged_entries(nested, path, depth + 1))
        return entries

    def key(self, node: Node, path: KeyPath) -> str | None:
        if isinstance(node, ScalarNode):
            return str(node.value)
        self.problem(path, node, f"a key must be a plain name, found {_kind_of(node)}")
        return None
