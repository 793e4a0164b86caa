"""Structured-output parameters of a request, as vLLM users know them (`StructuredOutputsParams`):
exactly one of `json` (a JSON Schema, as a dict or its JSON text), `json_object` (any JSON object),
`regex`, `grammar` (EBNF, XGrammar's dialect of GBNF), `choice` (one of these strings) or
`structural_tag` (an XGrammar structural tag as JSON text: the server builds one for tool calls).

`key()` is what the grammar cache is keyed on: two requests with the same constraint share one compile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from dsgraph.runtime.sampling_params import RequestError

__all__ = ["KINDS", "StructuredOutputsParams", "check_structured_outputs"]

KINDS = ("json", "json_object", "regex", "grammar", "choice", "structural_tag")
_FIELD = "structured_outputs"


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """One output constraint; `validate` raises RequestError naming `structured_outputs.<field>`.

    `disable_any_whitespace`: JSON without whitespace between tokens (XGrammar's compact JSON), so a
    model cannot pad its output with endless blanks; default off, as in vLLM.
    """

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        """The one constraint set (validate first)."""
        return next(k for k in KINDS if self._is_set(k))

    def _is_set(self, name: str) -> bool:
        value = getattr(self, name)
        return value is True if name == "json_object" else value is not None

    def validate(self) -> StructuredOutputsParams:
        """Exactly one constraint, of the right type; returns self so calls can chain."""
        chosen = [k for k in KINDS if self._is_set(k)]
        if len(chosen) != 1:
            raise RequestError(_FIELD, chosen or None, f"exactly one of {list(KINDS)} set")
        if not isinstance(self.json_object, bool):
            raise RequestError(f"{_FIELD}.json_object", self.json_object, "a bool")
        if not isinstance(self.disable_any_whitespace, bool):
            raise RequestError(f"{_FIELD}.disable_any_whitespace", self.disable_any_whitespace, "a bool")
        if self.json is not None:
            _json_schema_text(self.json)
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise RequestError(f"{_FIELD}.{name}", value, "a non-empty string")
        if self.choice is not None:
            if not isinstance(self.choice, tuple) or not self.choice:
                raise RequestError(f"{_FIELD}.choice", self.choice, "a non-empty list of strings")
            for i, c in enumerate(self.choice):
                if not isinstance(c, str) or not c:
                    raise RequestError(f"{_FIELD}.choice[{i}]", c, "a non-empty string")
        return self

    def key(self) -> tuple[str, str, bool]:
        """(kind, canonical constraint text, compact JSON): the grammar cache's key."""
        kind = self.kind
        if kind == "json":
            text = _json_schema_text(self.json)
        elif kind == "choice":
            text = json.dumps(list(self.choice or ()))
        elif kind == "json_object":
            text = ""
        else:
            text = str(getattr(self, kind))
        return kind, text, self.disable_any_whitespace

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StructuredOutputsParams:
        """From a request body's object; an unknown key is a RequestError naming it."""
        if not isinstance(values, dict):
            raise RequestError(_FIELD, values, "an object")
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise RequestError(f"{_FIELD}.{key}", values[key], f"one of the fields {sorted(known)}")
        return cls(**values).validate()


def _json_schema_text(schema: object) -> str:
    """A JSON Schema as compact JSON text. Keys keep their order: the output follows the order of
    `properties`, so two orders are two grammars."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise RequestError(f"{_FIELD}.json", schema, f"a JSON Schema (not valid JSON: {exc})") from exc
    if not isinstance(schema, (dict, bool)):
        raise RequestError(f"{_FIELD}.json", schema, "a JSON Schema object")
    return json.dumps(schema, separators=(",", ":"))


def check_structured_outputs(value: object) -> None:
    """`SamplingParams.structured_outputs`: a valid StructuredOutputsParams."""
    if not isinstance(value, StructuredOutputsParams):
        raise RequestError(_FIELD, value, "a StructuredOutputsParams")
    value.validate()
