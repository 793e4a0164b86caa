"""The recipe's request errors rewritten to name the field (its path in the body), the value and what is
expected: serde's parser messages ("invalid value: integer `-5`, expected u32", "missing field `role`")
and the recipe's own conversion messages ("Empty input messages", "Invalid json schema: ...")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.fields import U32_MAX

__all__ = ["find_value", "name_conversion_error", "name_recipe_error"]

_VALUE = re.compile(r"invalid value: (?:integer|floating point|string) `?([^`,]*)`?, expected (.+)$")
_VARIANT = re.compile(r"unknown variant `([^`]*)`, expected (.+)$")
_MISSING = re.compile(r"missing field `([^`]*)`")
# serde's "invalid type: string "x", expected f32"; the value spelled as JSON would spell it
_TYPE = re.compile(
    r'invalid type: (?:string "([^"]*)"|integer `([^`]*)`|floating point `([^`]*)`|boolean `([^`]*)`)'
    r", expected (.+)$"
)
_SHOULD_BE = re.compile(r"invalid request body: (\w+) should be (.+)$")
_TOOL_CHOICE = re.compile(r"invalid request body: expected one of `none`, `auto`, `required`")
_RUST_TYPES = {
    "u8": "an integer in [0, 255]",
    "u16": "an integer in [0, 65535]",
    "u32": f"an integer in [0, {U32_MAX}]",
    "u64": f"an integer in [0, {2**64 - 1}]",
    "i32": f"an integer in [{-(2**31)}, {2**31 - 1}]",
    "i64": f"an integer in [{-(2**63)}, {2**63 - 1}]",
    "f32": "a number",
    "f64": "a number",
}
# required fields of nested objects -> the places (paths, list indices as []) they live in, in order
_CONTAINERS = {
    "role": ("messages[]", "input[]"),
    "content": ("messages[]", "input[]"),
    "tool_call_id": ("messages[]",),
    "name": ("tools[].function", "tools[]", "tool_choice.function", "tool_choice"),
    "arguments": ("messages[].tool_calls[].function",),
    "id": ("messages[].tool_calls[]", "messages[].content[]"),
    "type": ("tools[]", "messages[].content[]", "input[]", "tool_choice"),
    "text": ("messages[].content[]", "input[].content[]"),
}


def name_recipe_error(message: str, values: Any, checked: tuple[str, ...] = ()) -> ApiError:
    """The recipe's parser message as a 400 naming the field. A value spelled the same in several fields
    is looked for outside `checked` first (top-level fields the server has validated already)."""
    if m := _MISSING.search(message):
        path = _missing_path(values, m[1])
        return ApiError(400, f"{path}: required ({message})", path)
    if m := _TYPE.search(message):
        raw = next(g for g in m.groups()[:4] if g is not None)
        path = _first(values, raw, checked, bools=True)
        if path is not None:
            expected = m[5].strip()
            return ApiError(400, f"{path}: {raw}, expected {_RUST_TYPES.get(expected, expected)}", path)
    for pattern in (_VALUE, _VARIANT):
        if m := pattern.search(message):
            raw, expected = m[1], m[2].strip()
            path = _first(values, raw, checked)
            if path is not None:
                expected = _RUST_TYPES.get(expected, expected)
                return ApiError(400, f"{path}: {raw}, expected {expected}", path)
    if m := _SHOULD_BE.search(message):
        path, value = next(_keyed(values, m[1], lambda v: not isinstance(v, (str, list))), (m[1], None))
        return ApiError(400, f"{path}: {value!r}, expected {m[2].strip()}", path)
    if _TOOL_CHOICE.search(message) and isinstance(values, dict) and "tool_choice" in values:
        expected = message.split("expected ", 1)[1]
        return ApiError(400, f"tool_choice: {values['tool_choice']!r}, expected {expected}", "tool_choice")
    return ApiError(400, message)


def name_conversion_error(err: ApiError, values: Any) -> ApiError:
    """A recipe ConversionError (its own OpenAI error body) with `param` and the message naming the field
    and value where the recipe left them out."""
    body = err.body["error"]
    if body.get("param") or not isinstance(values, dict):
        return err
    message = str(body.get("message", err))
    path, value = _conversion_field(message, values)
    if path is None:
        return err
    shown = "" if value is _NONE else f"{value!r}: "
    text = message.lstrip(".") if message.lstrip(".").startswith(path) else f"{path}: {shown}{message}"
    named = ApiError(err.status, text, path)
    named.body["error"] = {**body, "message": named.body["error"]["message"], "param": path}
    return named


_NONE = object()


def _conversion_field(message: str, values: dict[str, Any]) -> tuple[str | None, Any]:
    if message.startswith("The supported API model names are"):
        return "model", values.get("model")
    if message == "Empty input messages":
        return "messages", values.get("messages")
    if m := re.match(r"Invalid (presence_penalty|frequency_penalty) value", message):
        return m[1], values.get(m[1])
    if message.startswith("Invalid json schema"):
        return next(_keyed(values, "schema", lambda v: True), (None, None))[0], _NONE
    if m := re.match(r"Invalid schema for function '([^']*)'", message):
        return _tool_schema_path(values, m[1]), _NONE
    if m := re.match(r"\.?((?:messages|input|tools)\[\d+\][\w.\[\]]*): ", message):
        return m[1], _NONE
    return None, None


def _tool_schema_path(values: dict[str, Any], name: str) -> str | None:
    for i, tool in enumerate(values.get("tools") or ()):
        if not isinstance(tool, dict):
            continue
        if tool.get("name") == name:  # Anthropic
            return f"tools[{i}].input_schema"
        fn = tool.get("function")
        if isinstance(fn, dict) and fn.get("name") == name:
            return f"tools[{i}].function.parameters"
    return None


def _missing_path(values: Any, key: str) -> str:
    """Where a required `key` is missing: an object typed after it ({"type": "function"} lacks
    "function"), else the first object of the places that field lives in (_CONTAINERS) that lacks it,
    else the body itself."""
    if not isinstance(values, dict):
        return key
    objects = list(_objects(values, ""))
    for path, obj in objects:
        if path and obj.get("type") == key and key not in obj:
            return f"{path}.{key}"
    for container in _CONTAINERS.get(key, ()):
        for path, obj in objects:
            if re.sub(r"\[\d+\]", "[]", path) == container and key not in obj:
                return f"{path}.{key}"
    return key


def _objects(values: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(values, dict):
        yield path, values
        for k, v in values.items():
            yield from _objects(v, f"{path}.{k}" if path else str(k))
    elif isinstance(values, list):
        for i, v in enumerate(values):
            yield from _objects(v, f"{path}[{i}]")


def _keyed(values: Any, key: str, wanted: Callable[[Any], bool]) -> Iterator[tuple[str, Any]]:
    """(path, value) of every field named `key` whose value is `wanted`."""
    for path, obj in _objects(values, ""):
        if key in obj and wanted(obj[key]):
            yield (f"{path}.{key}" if path else key), obj[key]


def _first(values: Any, raw: str, checked: tuple[str, ...], bools: bool = False) -> str | None:
    paths = list(find_values(values, raw, "", bools))
    fresh = [p for p in paths if re.split(r"[.\[]", p, maxsplit=1)[0] not in checked]
    return (fresh or paths or [None])[0]


def find_value(values: Any, raw: str, path: str = "", bools: bool = False) -> str | None:
    """The path (`messages[0].role`) of the first scalar spelled `raw` (strings unquoted); booleans
    only with `bools` (serde names them apart from integers)."""
    return next(find_values(values, raw, path, bools), None)


def find_values(values: Any, raw: str, path: str = "", bools: bool = False) -> Iterator[str]:
    """The paths of every scalar spelled `raw`, in document order."""
    if isinstance(values, dict):
        items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in values.items())
    elif isinstance(values, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(values))
    elif isinstance(values, bool):
        if bools and raw == ("true" if values else "false"):
            yield path
        return
    else:
        text = values if isinstance(values, str) else repr(values)
        if text == raw:
            yield path
        return
    for sub, v in items:
        yield from find_values(v, raw, sub, bools)
