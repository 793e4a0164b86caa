"""SamplingParams: defaults, validation errors that name the field, value and range, and seeds."""

from __future__ import annotations

import math

import pytest

from dsgraph.runtime.sampling_params import (
    MAX_TOP_LOGPROBS,
    RequestError,
    SamplingParams,
    completion_seed,
    seed_to_i64,
)

VOCAB = 1000


def test_defaults_are_deepinfers_and_valid() -> None:
    p = SamplingParams().validate(VOCAB)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens, p.n) == (1.0, 1.0, -1, 0.0, 16, 1)
    assert (p.stop, p.stop_token_ids, p.seed, p.logprobs, p.prompt_logprobs) == ((), (), None, None, None)
    assert (p.min_tokens, p.skip_special_tokens, p.include_stop_str_in_output) == (0, True, False)
    assert not p.is_greedy and SamplingParams(temperature=0).is_greedy


BAD = [
    ("temperature", -1.0, "temperature: -1.0 must be >= 0"),
    ("temperature", math.nan, "temperature: nan must be >= 0"),
    ("temperature", math.inf, "temperature: inf must be >= 0"),
    ("temperature", "hot", "temperature: 'hot' must be a number >= 0"),
    ("top_p", 1.5, r"top_p: 1.5 must be in \(0, 1\]"),
    ("top_p", 0.0, r"top_p: 0.0 must be in \(0, 1\]"),
    ("top_k", 0, r"top_k: 0 must be in 1..2147483647 \(or -1 for off\)"),
    ("top_k", -2, "top_k: -2 must be in 1..2147483647"),
    ("top_k", 2.5, "top_k: 2.5 must be an int in 1..2147483647"),
    ("top_k", True, "top_k: True must be an int"),
    ("min_p", 1.5, r"min_p: 1.5 must be in \[0, 1\]"),
    ("max_tokens", 0, "max_tokens: 0 must be in 1..2147483647"),
    ("max_tokens", 2**31, "max_tokens: 2147483648 must be in 1..2147483647"),
    ("stop", ["ok", ""], r"stop\[1\]: '' must be a non-empty string"),
    ("stop", 5, "stop: 5 must be a list"),
    ("stop_token_ids", [3, VOCAB], r"stop_token_ids\[1\]: 1000 must be in 0..999 \(a token id\)"),
    ("stop_token_ids", [-1], r"stop_token_ids\[0\]: -1 must be in 0..999"),
    ("ignore_eos", 1, "ignore_eos: 1 must be a bool"),
    ("logprobs", "yes", r"logprobs: 'yes' must be an int in 0..20 \(the number of most likely tokens"),
    ("logprobs", True, "logprobs: True must be an int in 0..20"),
    ("logprobs", MAX_TOP_LOGPROBS + 1, "logprobs: 21 must be in 0..20"),
    ("logprobs", -1, "logprobs: -1 must be in 0..20"),
    ("prompt_logprobs", 21, "prompt_logprobs: 21 must be in 0..20"),
    ("prompt_logprobs", False, "prompt_logprobs: False must be an int"),
    ("min_tokens", 17, r"min_tokens: 17 must be in 0..16 \(at most max_tokens\)"),
    ("min_tokens", -1, "min_tokens: -1 must be in 0..16"),
    ("skip_special_tokens", "no", "skip_special_tokens: 'no' must be a bool"),
    ("include_stop_str_in_output", 0, "include_stop_str_in_output: 0 must be a bool"),
    ("seed", 2**64, "seed: 18446744073709551616 must be in"),
    ("seed", 1.0, "seed: 1.0 must be an int"),
    ("n", 0, "n: 0 must be in 1.."),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD)
def test_validation_names_field_value_and_range(field: str, value: object, message: str) -> None:
    with pytest.raises(RequestError, match=f"^{message}") as info:
        SamplingParams(**{field: value}).validate(VOCAB)
    err = info.value
    assert isinstance(err, ValueError) and err.field.startswith(field) and err.expected in str(err)


def test_edges_of_the_ranges_are_valid() -> None:
    SamplingParams(temperature=0, top_p=1e-9, top_k=1, min_p=1.0, max_tokens=1).validate(VOCAB)
    SamplingParams(top_k=2**31 - 1, logprobs=20, seed=2**64 - 1, stop_token_ids=[0, 999]).validate(VOCAB)
    SamplingParams(seed=-(2**63), n=4, stop=["\n\n", "</s>"], logprobs=0, prompt_logprobs=0).validate(1)
    SamplingParams(max_tokens=5, min_tokens=5, prompt_logprobs=20).validate(VOCAB)
    with pytest.raises(RequestError, match="vocab_size: 0 must be a positive int"):
        SamplingParams().validate(0)


def test_stop_lists_become_tuples_and_params_stay_hashable() -> None:
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[1, 2])
    q = SamplingParams(stop="a")
    assert p.stop == ("a", "b") and p.stop_token_ids == (1, 2) and q.stop == ("a",)
    assert hash(p) == hash(SamplingParams(stop=("a", "b"), stop_token_ids=(1, 2)))
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


def test_from_dict_rejects_unknown_fields() -> None:
    assert SamplingParams.from_dict({"temperature": 0.5, "stop": ["x"]}).stop == ("x",)
    with pytest.raises(RequestError, match="^best_of: 2 must be one of the fields"):
        SamplingParams.from_dict({"best_of": 2})


def test_op_row_holds_the_sample_op_values() -> None:
    assert SamplingParams(temperature=0, top_p=0.5, top_k=7, min_p=0.1).op_row() == (0.0, 0.5, 7, 0.1)


def test_seeds() -> None:
    assert seed_to_i64(2**64 - 1) == -1 and seed_to_i64(2**63) == -(2**63) and seed_to_i64(-5) == -5
    seeds = SamplingParams(seed=1234, n=6).completion_seeds()
    assert seeds == SamplingParams(seed=1234, n=6).completion_seeds(), "a fixed seed gives fixed streams"
    assert seeds[0] == 1234 and len(set(seeds)) == 6
    assert all(-(2**63) <= s < 2**63 for s in seeds)
    assert completion_seed(2**64 - 1, 0) == -1
    # Neighbouring requests' seeds give unrelated completion seeds (no shared streams).
    assert not set(seeds) & set(SamplingParams(seed=1235, n=6).completion_seeds())
    random_a, random_b = SamplingParams(n=2).completion_seeds(), SamplingParams(n=2).completion_seeds()
    assert random_a != random_b, "seed None must draw a fresh seed per request"
