"""Request fields the server checks itself, so that every error names the field, its value and the allowed
range: numeric ranges and required fields per protocol, the fields the recipe does not carry through
(`seed` on every endpoint, `max_completion_tokens`), and the recipe's own parser messages
("invalid value: integer `-5`, expected u32") rewritten to name the field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dsgraph.runtime.sampling_params import MAX_TOP_LOGPROBS
from dsgraph.runtime.server.errors import ApiError

U32_MAX = 2**32 - 1
SEED_RANGE = (-(2**63), 2**64 - 1)  # any 64-bit integer, signed or not (SamplingParams.seed)


@dataclass(frozen=True)
class Bound:
    """A numeric field's closed range; `required`: the protocol makes the field mandatory."""

    low: float
    high: float
    integer: bool = True
    required: bool = False

    def expected(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} in [{_num(self.low)}, {_num(self.high)}]"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_SEED = Bound(*SEED_RANGE)
_TOKENS = Bound(1, U32_MAX)
_TOP_LOGPROBS = Bound(0, MAX_TOP_LOGPROBS)
_OPENAI = {
    "temperature": Bound(0, 2, integer=False),
    "top_p": Bound(0, 1, integer=False),
    "seed": _SEED,
    "top_logprobs": _TOP_LOGPROBS,
}
# per Api.name; a protocol without an entry gets only the recipe's checks
BOUNDS: dict[str, dict[str, Bound]] = {
    "chat": {**_OPENAI, "max_tokens": _TOKENS, "max_completion_tokens": _TOKENS, "n": Bound(1, 1)},
    "responses": {**_OPENAI, "max_output_tokens": _TOKENS},
    "messages": {
        "temperature": Bound(0, 1, integer=False),  # Anthropic's range
        "top_p": Bound(0, 1, integer=False),
        "top_k": Bound(0, U32_MAX),
        "max_tokens": Bound(1, U32_MAX, required=True),
        "seed": _SEED,  # not Anthropic's; the common extension of self-hosted servers
    },
}


@dataclass(frozen=True)
class Extras:
    """What the server takes from the body itself: the seed, and a limit on generated tokens that the
    recipe ignores (`max_completion_tokens`), applied together with the recipe's (the smaller wins)."""

    seed: int | None = None
    max_tokens: int | None = None


def check_bounds(api_name: str, values: dict[str, Any]) -> None:
    """400 for a missing required field or a number outside its range (types are checked before)."""
    for field, bound in BOUNDS.get(api_name, {}).items():
        value = values.get(field)
        if value is None:
            if bound.required:
                raise ApiError(400, f"{field}: required, expected {bound.expected()}", field)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # the type check reports it
        if bound.integer and not isinstance(value, int) or not bound.low <= value <= bound.high:
            raise ApiError(400, f"{field}: {value!r}, expected {bound.expected()}", field)


def take_extras(api_name: str, values: dict[str, Any]) -> tuple[dict[str, Any], Extras]:
    """The body for the recipe (without `seed`, which the server applies on every endpoint) and the
    extras. Call after check_bounds."""
    body = {k: v for k, v in values.items() if k != "seed"}
    cap = values.get("max_completion_tokens") if api_name == "chat" else None
    return body, Extras(values.get("seed"), cap)


_VALUE = re.compile(r"invalid value: (?:integer|floating point|string) `?([^`,]*)`?, expected (.+)$")
_VARIANT = re.compile(r"unknown variant `([^`]*)`, expected (.+)$")
_MISSING = re.compile(r"missing field `([^`]*)`")
# serde's "invalid type: string "x", expected f32"; the value spelled as JSON would spell it
_TYPE = re.compile(
    r'invalid type: (?:string "([^"]*)"|integer `([^`]*)`|floating point `([^`]*)`|boolean `([^`]*)`)'
    r", expected (.+)$"
)
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


def name_recipe_error(message: str, values: Any) -> ApiError:
    """The recipe's parser message as a 400 naming the field (found by its value in the body)."""
    if m := _MISSING.search(message):
        return ApiError(400, f"{m[1]}: required ({message})", m[1])
    if m := _TYPE.search(message):
        raw = next(g for g in m.groups()[:4] if g is not None)
        path = find_value(values, raw, bools=True)
        if path is not None:
            expected = m[5].strip()
            return ApiError(400, f"{path}: {raw}, expected {_RUST_TYPES.get(expected, expected)}", path)
    for pattern in (_VALUE, _VARIANT):
        if m := pattern.search(message):
            raw, expected = m[1], m[2].strip()
            path = find_value(values, raw)
            if path is not None:
                expected = _RUST_TYPES.get(expected, expected)
                return ApiError(400, f"{path}: {raw}, expected {expected}", path)
    return ApiError(400, message)


def find_value(values: Any, raw: str, path: str = "", bools: bool = False) -> str | None:
    """The path (`messages[0].role`) of the first scalar spelled `raw` (strings unquoted); booleans
    only with `bools` (serde names them apart from integers)."""
    if isinstance(values, dict):
        items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in values.items())
    elif isinstance(values, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(values))
    elif isinstance(values, bool):
        return path if bools and raw == ("true" if values else "false") else None
    else:
        text = values if isinstance(values, str) else repr(values)
        return path if text == raw else None
    for sub, v in items:
        found = find_value(v, raw, sub, bools)
        if found is not None:
            return found
    return None
