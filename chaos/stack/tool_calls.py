"""Streamed tool calls of the builtin server: ``tools`` / ``tool_choice`` checked in OpenAI's shapes, and a
forced call's arguments made from the generated text, fragment by fragment (pure functions and one small
per-request object; nothing here touches the engine or a socket).

The tiny model does not choose tools: a chat request with ``tool_choice: "required"`` (the first tool) or
``{"type": "function", "function": {"name": X}}`` (tool X) is answered with one call of that tool whose
arguments are a JSON object of one string, the generated text: ``{"<key>": "<text, JSON-escaped>"}``,
``key`` the tool's first required string parameter, else ``input``. The tokens are the model's, only their
envelope is a call: OpenAI's and vLLM's stream shape, a first delta with the call's index, id, type, name
and empty arguments, then one ``function.arguments`` fragment per generated token (the opening
``{"key": "`` with the first, the closing ``"}`` as the last), ``finish_reason: "tool_calls"``.
``"auto"``, ``"none"`` or no ``tool_choice`` answers with content, as a model that chose no tool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .protocol import RequestInvalid

__all__ = ["DEFAULT_KEY", "MAX_TOOLS", "ToolCall", "ToolCallStream", "argument_key", "parse_tool_request"]

MAX_TOOLS = 128  # OpenAI's limit on the tools of one request
DEFAULT_KEY = "input"  # the argument the text fills when the tool names no required string parameter
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function name
_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolCall:
    """The call a request forces: which function, and the argument its generated text fills."""

    name: str
    key: str


def _invalid(message: str, param: str, code: str = "invalid_value") -> RequestInvalid:
    return RequestInvalid(message, param=param, code=code)


def _shown(value: object) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return type(value).__name__


def _tools(raw: object) -> list[dict[str, Any]]:
    """The request's function tools, each checked: ``{"type": "function", "function": {"name", ...}}``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid(f"'tools' must be a list of tool objects, found {_shown(raw)}", "tools", "invalid_type")
    if len(raw) > MAX_TOOLS:
        raise _invalid(f"'tools' may hold at most {MAX_TOOLS} tools, found {len(raw)}", "tools")
    return [_function(f"tools[{i}]", tool) for i, tool in enumerate(raw)]


# a function's optional fields: (key, the type it must have, what that is in words)
_OPTIONAL: tuple[tuple[str, type, str], ...] = (
    ("description", str, "a string"), ("parameters", dict, "a JSON Schema object"), ("strict", bool, "true or false"),
)


def _function(where: str, tool: object) -> dict[str, Any]:
    """One tool's ``function`` object, checked."""
    if not isinstance(tool, dict):
        raise _invalid(f"'{where}' must be an object {{\"type\": \"function\", \"function\": {{...}}}}, found "
                       f"{_shown(tool)}", where, "invalid_type")
    if tool.get("type") != "function":
        raise _invalid(f"'{where}.type' must be 'function' (the only tool type the builtin server serves), found "
                       f"{_shown(tool.get('type'))}", f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _invalid(f"'{where}.function' must be an object with a 'name', found {_shown(function)}",
                       f"{where}.function", "invalid_type")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _invalid(f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-', found {_shown(name)}",
                       f"{where}.function.name")
    for key, kind, words in _OPTIONAL:
        value = function.get(key)
        if value is not None and not isinstance(value, kind):
            raise _invalid(f"'{where}.function.{key}' must be {words}, found {_shown(value)}",
                           f"{where}.function.{key}", "invalid_type")
    return function


def argument_key(parameters: Mapping[str, Any] | None) -> str:
    """The argument a call's text fills: the schema's first required property of type string, else
    ``input``. Pure."""
    if not parameters:
        return DEFAULT_KEY
    required, properties = parameters.get("required"), parameters.get("properties")
    if not isinstance(required, list) or not isinstance(properties, dict):
        return DEFAULT_KEY
    for name in required:
        prop = properties.get(name) if isinstance(name, str) else None
        kind = prop.get("type") if isinstance(prop, dict) else None
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return str(name)
    return DEFAULT_KEY


def parse_tool_request(data: Mapping[str, Any]) -> ToolCall | None:
    """The call a chat request's ``tools`` and ``tool_choice`` force, or None (content); ``RequestInvalid``
    (400, OpenAI's error object) for a malformed one, naming the field."""
    functions = _tools(data.get("tools"))
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _invalid(f"'parallel_tool_calls' must be true or false, found {_shown(parallel)}", "parallel_tool_calls",
                       "invalid_type")
    choice = data.get("tool_choice")
    if choice is None or choice in ("none", "auto"):
        return None
    wanted = _wanted(choice)
    if not functions:
        raise _invalid("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
    if wanted is None:
        function = functions[0]
    else:
        found = next((f for f in functions if f["name"] == wanted), None)
        if found is None:
            names = ", ".join(repr(f["name"]) for f in functions[:8])
            raise _invalid(f"'tool_choice' names the function {wanted!r}, which is not among 'tools' ({names})",
                           "tool_choice")
        function = found
    return ToolCall(name=function["name"], key=argument_key(function.get("parameters")))


_CHOICE_SHAPE = '{"type": "function", "function": {"name": ...}}'


def _wanted(choice: object) -> str | None:
    """The function a forcing ``tool_choice`` names: None for ``required`` (the first tool)."""
    if choice == "required":
        return None
    if not isinstance(choice, dict):
        raise _invalid(f"'tool_choice' must be one of {', '.join(_CHOICES)} or {_CHOICE_SHAPE}, found {_shown(choice)}",
                       "tool_choice")
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _invalid(f"'tool_choice' as an object must be {_CHOICE_SHAPE}, found {_shown(choice)}", "tool_choice")
    return name


def _escaped(text: str) -> str:
    """``text`` as the inside of a JSON string: escaping each piece of a text and joining them gives the
    escaped whole (JSON escapes character by character)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ToolCallStream:
    """One forced call of one request: its first delta, then its argument fragments as text arrives."""

    def __init__(self, call: ToolCall, call_id: str) -> None:
        self.call = call
        self.call_id = call_id
        self.started = False  # the first delta (id, type, name) went out
        self.opened = False  # the opening {"key": " went out
        self.arguments: list[str] = []  # every fragment so far (a non-streaming answer joins them)

    def head(self) -> dict[str, Any]:
        """The call's first delta: index, id, type and name, with empty arguments."""
        self.started = True
        return {"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                "function": {"name": self.call.name, "arguments": ""}}]}

    def fragment(self, text: str) -> dict[str, Any]:
        """The delta carrying ``text`` as an argument fragment (the opening goes with the first)."""
        piece = _escaped(text)
        if not self.opened:
            self.opened = True
            piece = "{" + json.dumps(self.call.key, ensure_ascii=False) + ": \"" + piece
        return self._arguments(piece)

    def close(self) -> dict[str, Any]:
        """The last fragment: the closing ``"}`` (with the opening, when no text came at all)."""
        piece = "\"}"
        if not self.opened:
            self.opened = True
            piece = "{" + json.dumps(self.call.key, ensure_ascii=False) + ": \"" + piece
        return self._arguments(piece)

    def _arguments(self, piece: str) -> dict[str, Any]:
        self.arguments.append(piece)
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}

    def message(self) -> dict[str, Any]:
        """The whole call, as a non-streaming answer's ``message.tool_calls[0]``."""
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.call.name, "arguments": "".join(self.arguments)}}
