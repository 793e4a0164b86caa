"""Structured output end to end (cpu, tiny random checkpoint with DeepSeek's real tokenizer): for JSON
Schemas (nested objects, bounded arrays, enums, numbers, patterns, optional fields, `$ref`), regexes, an
EBNF grammar and a choice list, every output that ends with "stop" parses and validates, independently
of XGrammar (`jsonschema`, `re`); with drafting off, forced on (drafts fed from a run without drafting,
one of them wrong each pass: deterministic verification must reproduce that run token for token) and
exact; greedy and sampled; batched with unconstrained requests, whose tokens stay those of a run
without any constrained request."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from dsgraph.models.deepseek_v41.tiny import make_tiny
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.structured import StructuredOutputsParams as S
from tests.engine_faults import draft_hook
from tests.runtime.test_spec_engine import CURVE

_INT = {"type": "integer", "minimum": -99, "maximum": 99}
SCHEMAS = {
    "nested_array": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": _INT,
                    "tags": {
                        "type": "array",
                        "items": {"type": "string", "maxLength": 3},
                        "minItems": 1,
                        "maxItems": 2,
                    },
                },
                "required": ["id", "tags"],
            }
        },
        "required": ["user"],
    },
    "enum_number": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "x": {"type": "number"},
            "ok": {"type": "boolean"},
        },
        "required": ["color", "x", "ok"],
    },
    "pattern_optional": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
            "note": {"type": "string", "maxLength": 4},
        },
        "required": ["code"],
    },
    "ref": {
        "$defs": {"pt": {"type": "object", "properties": {"x": _INT, "y": _INT}, "required": ["x", "y"]}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
        "required": ["a", "b"],
    },
}
REGEXES = [r"[a-z]{3}-\d{2}", r"(cat|dog)s?", r"\d{1,3}(\.\d{1,2})?"]
EBNF = 'root ::= "(" num ("," num)? ")"\nnum ::= [0-9] [0-9]?'
CHOICES = ("alpha", "beta", "gamma delta")


def _json_check(schema: dict[str, Any]) -> Callable[[str], None]:
    return lambda text: jsonschema.validate(json.loads(text), schema)


def _regex_check(pattern: str) -> Callable[[str], None]:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), (pattern, text)

    return check


def _choice_check(text: str) -> None:
    assert text in CHOICES, text


CASES: list[tuple[S, Callable[[str], None]]] = [
    *((S(json=s, disable_any_whitespace=True), _json_check(s)) for s in SCHEMAS.values()),
    *((S(regex=r), _regex_check(r)) for r in REGEXES),
    (S(grammar=EBNF), _regex_check(r"\(\d{1,2}(,\d{1,2})?\)")),
    (S(choice=CHOICES), _choice_check),
]
PROMPT = [100, 2000, 30000, 400]
FREE = [
    SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    SamplingParams(seed=9, max_tokens=12),
]


def _params() -> list[SamplingParams]:
    out = []
    for i, (so, _) in enumerate(CASES):
        out.append(SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=so))
        out.append(SamplingParams(temperature=1.0, seed=10 + i, max_tokens=48, structured_outputs=so))
    return out + FREE


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_tiny(tmp_path_factory.mktemp("tiny_structured"), seed=0, tokenizer="deepseek")


def _llm(model_dir, **kw: Any) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(model_dir, max_model_len=128, max_num_seqs=24, **kw)


@pytest.fixture(scope="module")
def reference(model_dir):  # type: ignore[no-untyped-def]
    """Drafting off: the whole batch, and the unconstrained requests alone."""
    llm = _llm(model_dir, speculative="off")
    params = _params()
    outs = [o.outputs[0] for o in llm.generate([PROMPT] * len(params), params)]
    alone = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(FREE), FREE)]
    return outs, alone


def _check(outs: list[Any]) -> None:
    """Every constrained output that stops validates; most of them stop (the bounds make them short)."""
    stopped = 0
    for k, (_, check) in enumerate(CASES):
        for out in outs[2 * k : 2 * k + 2]:
            assert out.finish_reason in ("stop", "length"), out
            if out.finish_reason == "stop":
                check(out.text)
                stopped += 1
    assert stopped >= 0.75 * 2 * len(CASES), [o.text for o in outs]


@pytest.mark.slow
def test_outputs_validate_without_drafting(reference) -> None:  # type: ignore[no-untyped-def]
    outs, alone = reference
    _check(outs)
    # the unconstrained requests of the mixed batch: the tokens of a batch without constrained ones
    assert [o.token_ids for o in outs[-len(FREE) :]] == alone


def _feed(llm: LLM, expected: dict[int, tuple[int, ...]]) -> None:
    """Drafts = the run without drafting's continuation, one draft made wrong per pass (in turn)."""
    eng, calls = llm.engine, [0]
    assert eng.spec is not None

    def hook(rid: int, position: int, drafts: list[int], conf: list[float]):  # type: ignore[no-untyped-def]
        first = position + 1 - len(eng.live[rid].prompt)
        d = list(expected[rid][first : first + len(drafts)])
        wrong, calls[0] = calls[0] % 4, calls[0] + 1
        if wrong < len(d):
            d[wrong] = (d[wrong] + 1) % eng.cfg.text.vocab_size
        return d, [0.9] * len(d)

    draft_hook(eng).fn = hook


@pytest.mark.slow
def test_forced_drafting_reproduces_the_run_without_drafting(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    outs, _ = reference
    llm = _llm(
        model_dir, speculative="dspark", deterministic=True, verify_schedule="fixed", throughput_curve=CURVE
    )
    params = _params()
    # LLM.generate numbers the requests 0.. in order (rid = index with n = 1)
    _feed(llm, {i: outs[i].token_ids for i in range(len(params))})
    got = [o.outputs[0] for o in llm.generate([PROMPT] * len(params), params)]
    assert [g.token_ids for g in got] == [o.token_ids for o in outs]
    _check(got)
    constrained = got[: 2 * len(CASES)]
    assert sum(g.num_accepted_tokens for g in constrained) > 0  # the matchers advanced through drafts
    assert sum(g.num_draft_tokens - g.num_accepted_tokens for g in constrained) > 0  # and rolled back


@pytest.mark.slow
def test_exact_drafting_validates(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    outs, _ = reference
    llm = _llm(model_dir, speculative="dspark", throughput_curve=CURVE)
    params = _params()
    got = [o.outputs[0] for o in llm.generate([PROMPT] * len(params), params)]
    _check(got)
    # greedy rows accept a draft iff it is the target's argmax: the same tokens as without drafting
    greedy = [i for i, p in enumerate(params) if p.is_greedy]
    assert [got[i].token_ids for i in greedy] == [outs[i].token_ids for i in greedy]


def test_end_of_grammar_stops_generation(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = _llm(model_dir, speculative="off")
    params = [SamplingParams(seed=s, max_tokens=40, structured_outputs=S(choice=CHOICES)) for s in range(3)]
    for o in llm.generate([PROMPT] * 3, params):
        out = o.outputs[0]
        assert out.finish_reason == "stop" and out.text in CHOICES
        assert out.token_ids[-1] == llm.engine.cfg.eos_token_id  # the grammar allowed only EOS at its end
