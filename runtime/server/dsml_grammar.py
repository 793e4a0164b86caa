"""The EBNF grammar of DeepSeek-V4.1 DSML tool calls, as the recipe renders and parses them:

    <｜DSML｜ invoke name="NAME">\\n
    <｜DSML｜ parameter name="KEY" string="true">raw text</｜DSML｜ parameter>\\n      (string values)
    <｜DSML｜ parameter name="KEY" string="false">JSON</｜DSML｜ parameter>\\n         (all others)
    </｜DSML｜ invoke>\\n
    ... more invocations ...
    </｜DSML｜ calls>

Parameters come in the order of the schema's `properties`, required ones always, optional ones maybe;
a non-string value is compact JSON under its property's schema (XGrammar's JSON Schema grammar, its
rules renamed into the tool's namespace); a string value is raw text without `<` (an `enum` of strings
is its literals), at most `maxLength` characters.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["dsml_grammar"]

_CALLS_BEGIN, _CALLS_END = "<｜DSML｜ calls>\n", "</｜DSML｜ calls>"
# quoted strings and character classes of an EBNF body (rule names never occur inside them)
_OPAQUE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::=", re.M)


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _renamed(ebnf: str, prefix: str) -> str:
    """An EBNF text with every rule name given `prefix` (its root becomes `prefix` itself)."""
    names = set(_RULE.findall(ebnf))
    pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")

    def rename(m: re.Match[str]) -> str:
        return prefix if m.group(1) == "root" else f"{prefix}_{m.group(1)}"

    out, last = [], 0
    for m in _OPAQUE.finditer(ebnf):
        out.append(pattern.sub(rename, ebnf[last : m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(pattern.sub(rename, ebnf[last:]))
    return "".join(out)


def _is_string(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def _value(name: str, schema: Any, defs: Any) -> list[str]:
    """Rules of one parameter's value, the first named `name`."""
    if _is_string(schema):
        if "enum" in schema:
            return [f"{name} ::= " + " | ".join(_lit(str(v)) for v in schema["enum"])]
        bound = schema.get("maxLength")
        return [f"{name} ::= [^<]{{0,{int(bound)}}}" if bound is not None else f"{name} ::= [^<]*"]
    import xgrammar as xg

    full = schema if defs is None or not isinstance(schema, dict) else {**schema, "$defs": defs}
    ebnf = str(xg.Grammar.from_json_schema(json.dumps(full), any_whitespace=False))
    return [_renamed(ebnf, name)]


def _invoke(k: int, tool: dict[str, Any]) -> list[str]:
    fn = tool["function"]
    params = fn.get("parameters") or {}
    props, required = params.get("properties") or {}, set(params.get("required") or ())
    rules, parts = [], []
    for j, (key, schema) in enumerate(props.items()):
        kind = "true" if _is_string(schema) else "false"
        head = _lit(f'<｜DSML｜ parameter name="{key}" string="{kind}">')
        rules.append(f"t{k}_p{j} ::= {head} t{k}_v{j} {_lit('</｜DSML｜ parameter>' + chr(10))}")
        rules += _value(f"t{k}_v{j}", schema, params.get("$defs"))
        parts.append(f"t{k}_p{j}" if key in required else f"t{k}_p{j}?")
    begin, end = _lit(f'<｜DSML｜ invoke name="{fn["name"]}">\n'), _lit("</｜DSML｜ invoke>\n")
    return [f"t{k} ::= {begin} {' '.join(parts)} {end}", *rules]


def dsml_grammar(tools: list[dict[str, Any]], opened: bool, one: bool) -> str:
    """Tool calls of `tools` (Chat Completions function tools) up to `</｜DSML｜ calls>`; `opened`: the
    prompt ends inside the calls block already; `one`: a single invocation."""
    rules: list[str] = []
    for k, tool in enumerate(tools):
        rules += _invoke(k, tool)
    head = "" if opened else _lit("\n\n" + _CALLS_BEGIN) + " "
    calls = "invoke" if one else "invoke+"
    top = [
        f"root ::= {head}{calls} {_lit(_CALLS_END)}",
        "invoke ::= " + " | ".join(f"t{k}" for k in range(len(tools))),
    ]
    return "\n".join(top + rules) + "\n"
