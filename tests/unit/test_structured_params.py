"""StructuredOutputsParams: exactly one constraint, errors naming the field; SamplingParams checks it;
the cache key keeps a schema's property order (the output follows it)."""

from __future__ import annotations

import pytest

from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.structured import StructuredOutputsParams as S


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (S(), "structured_outputs"),
        (S(regex="a", choice=("b",)), "structured_outputs"),
        (S(json="{not json"), "structured_outputs.json"),
        (S(json=[1]), "structured_outputs.json"),  # type: ignore[arg-type]
        (S(regex=""), "structured_outputs.regex"),
        (S(grammar=3), "structured_outputs.grammar"),  # type: ignore[arg-type]
        (S(choice=()), "structured_outputs.choice"),
        (S(choice=("a", "")), "structured_outputs.choice[1]"),
    ],
)
def test_bad_params_name_the_field(params: S, field: str) -> None:
    with pytest.raises(RequestError) as err:
        params.validate()
    assert err.value.field == field
    with pytest.raises(RequestError):
        SamplingParams(structured_outputs=params).validate(256)


def test_from_dict_and_keys() -> None:
    with pytest.raises(RequestError, match="structured_outputs.guided_json"):
        S.from_dict({"guided_json": {}})
    a = S.from_dict({"json": {"type": "object", "properties": {"b": {}, "a": {}}}})
    b = S(json='{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert a.key() == b.key() and a.kind == "json"
    assert (
        S(json={"properties": {"a": {}, "b": {}}}).key() != S(json={"properties": {"b": {}, "a": {}}}).key()
    )
    assert S(choice=["x", "y"]).validate().key() == ("choice", '["x", "y"]', False)
    with pytest.raises(RequestError, match="a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": "a"}).validate(256)  # type: ignore[arg-type]
