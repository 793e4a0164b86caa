"""Request fields the server checks itself, so that every error names the field, its value and the allowed
range: numeric ranges and required fields per protocol, the fields the recipe does not carry through
(`seed` on every endpoint, `max_completion_tokens`), and OpenAI fields the engine has no counterpart for
(refused unless at their default). The recipe's own messages are rewritten in recipe_errors.py."""

from __future__ import annotations

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


# OpenAI fields that would change the output and have no counterpart in the engine yet: refused unless at
# their default (the recipe accepts and drops them; /v1/completions adds `suffix`)
UNSUPPORTED: dict[str, object] = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None}
UNSUPPORTED_BY_API = {"chat": UNSUPPORTED}


def check_unsupported(values: dict[str, Any], fields: dict[str, object]) -> None:
    for name, default in fields.items():
        value = values.get(name)
        if isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            continue  # not a number: the recipe's type error names it
        if value is not None and value != default and value != {}:
            raise ApiError(400, f"{name}: {value!r} is not supported yet (only {default!r})", name)
