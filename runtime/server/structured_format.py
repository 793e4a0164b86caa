"""The protocols' output constraints as StructuredOutputsParams (runtime/structured/).

- OpenAI `response_format` (`json_object`, `json_schema` with `strict`) on Chat Completions and
  `text.format` on Responses reach us as the recipe's output constraint of kind "json" (an empty schema:
  any JSON object) or "regex";
- `tool_choice` "required" or a named function (Chat, Responses) and Anthropic `tool` arrive as
  "tool_call_required": the prompt has opened the DSML calls block, so the output is one or more
  `<｜DSML｜ invoke name="...">` blocks, each tool's arguments constrained by its JSON Schema in the
  V4.1 parameter markup (strings raw with string="true", other values JSON with string="false";
  dsml_grammar.py), then `</｜DSML｜ calls>` and EOS;
- Anthropic `tool_choice` "any" arrives as the advisory "tool_call"; its calls block is not opened by the
  prompt, so the constraint writes it (`\\n\\n<｜DSML｜ calls>\\n` first);
- vLLM's `structured_outputs` object in the body (json, regex, grammar, choice, ...) is taken as is.

In thinking mode the prompt ends in `<think>`: free reasoning up to `</think>` comes first. JSON from
`response_format` is compact (XGrammar's separators, no free whitespace between tokens).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import deepseek_recipe as dr

from dsgraph.runtime.sampling_params import RequestError
from dsgraph.runtime.server.apis import MESSAGES, Api
from dsgraph.runtime.server.dsml_grammar import dsml_grammar
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.structured.params import StructuredOutputsParams

__all__ = ["BODY_FIELD", "constrains_tool_calls", "request_constraint", "structured_outputs", "wait_grammar"]

BODY_FIELD = "structured_outputs"  # vLLM's extra request field
_THINK_END = "</think>"


def structured_outputs(
    api: Api, body: dict[str, Any], conv: dr.ConversationRequest
) -> StructuredOutputsParams | None:
    """The request's constraint, or None; RequestError names the field of a bad one."""
    extra = body.get(BODY_FIELD)
    if extra is not None:
        return StructuredOutputsParams.from_dict(extra)
    oc = conv.inference_options.output_constraint
    if oc is None:
        return None
    fmt = _format(api, body, oc.kind, oc.schema, conv.parsing_options.starts_in_tool_calls)
    if fmt is None:
        return None
    if conv.conversation.thinking_mode:
        reasoning = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": _THINK_END}
        fmt = {"type": "sequence", "elements": [reasoning, fmt]}
    elif fmt["type"] == "json_schema":  # compact: a model cannot pad the object with endless blanks
        return StructuredOutputsParams(json=fmt["json_schema"], disable_any_whitespace=True)
    elif fmt["type"] == "regex":
        return StructuredOutputsParams(regex=fmt["pattern"])
    elif fmt["type"] == "grammar":
        return StructuredOutputsParams(grammar=fmt["grammar"])
    return StructuredOutputsParams(structural_tag=json.dumps({"type": "structural_tag", "format": fmt}))


def _format(api: Api, body: dict[str, Any], kind: str, schema: str, opened: bool) -> dict[str, Any] | None:
    """The constraint as an XGrammar structural-tag format, or None when it is advisory."""
    if kind == "json":
        return {"type": "json_schema", "json_schema": json.loads(schema) if schema else {"type": "object"}}
    if kind == "regex":
        return {"type": "regex", "pattern": schema}
    if kind == "tool_call_required":
        return _tool_calls(json.loads(schema), opened, _one_call(body))
    if kind == "tool_call" and api is MESSAGES and _anthropic_any(body):
        return _tool_calls(json.loads(schema), False, _one_call(body))
    if kind == "tool_call":
        return None  # tool_choice auto: the model decides; the recipe's parser extracts any calls
    raise RequestError("response_format", kind, "json, regex or a tool call")


def constrains_tool_calls(api: Api, body: dict[str, Any], conv: dr.ConversationRequest) -> bool:
    """Whether the request's output is constrained to DSML tool calls (the grammar of `_tool_calls`)."""
    oc = conv.inference_options.output_constraint
    if body.get(BODY_FIELD) is not None or oc is None:
        return False
    return oc.kind == "tool_call_required" or (
        oc.kind == "tool_call" and api is MESSAGES and _anthropic_any(body)
    )


def _anthropic_any(body: dict[str, Any]) -> bool:
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and choice.get("type") == "any"


def _one_call(body: dict[str, Any]) -> bool:
    """OpenAI `parallel_tool_calls: false` or Anthropic `disable_parallel_tool_use`: one call only."""
    choice = body.get("tool_choice")
    anthropic = isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True
    return body.get("parallel_tool_calls") is False or anthropic


def _tool_calls(tools: list[dict[str, Any]], opened: bool, one: bool) -> dict[str, Any]:
    """DSML invocations of `tools` (just one with `one`), closing the calls block (dsml_grammar.py)."""
    return {"type": "grammar", "grammar": dsml_grammar(tools, opened, one)}


def request_constraint(
    api: Api, body: bytes | dict[str, Any], conv: dr.ConversationRequest
) -> StructuredOutputsParams | None:
    """`structured_outputs` of a raw request body; an ApiError 400 naming the field of a bad one."""
    values = json.loads(body) if isinstance(body, bytes) else body  # the recipe has parsed it already
    try:
        return structured_outputs(api, values, conv)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc


async def wait_grammar(engine: Any, params: Any) -> None:
    """Compile a request's grammar before it is queued, off the event loop and the engine thread: a
    constraint that does not compile (in time) is a RequestError, so the client gets a 400."""
    constraint = params.structured_outputs
    if constraint is None:
        return
    await asyncio.get_running_loop().run_in_executor(None, engine.structured.cache.wait, constraint)
