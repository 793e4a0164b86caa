"""Every declared op has a rule (or an explicit, explained gap) on every platform."""

from __future__ import annotations

import dataclasses

import pytest

import dsgraph.ops  # noqa: F401
from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.op import all_ops
from dsgraph.ops import core as C
from dsgraph.platform.registry import PLATFORM_NAMES, LoweringError, Platform, get_platform, lower


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_every_op_has_a_rule_or_an_explained_gap(name: str) -> None:
    plat = get_platform(name)
    declared = {op.name for op in all_ops()}
    assert set(plat.rules) <= declared, f"{name}: rules for undeclared ops {set(plat.rules) - declared}"
    assert set(plat.unsupported) <= declared
    assert not set(plat.rules) & set(plat.unsupported), "an op is both supported and unsupported"
    missing = declared - set(plat.rules) - set(plat.unsupported)
    assert not missing, f"platform {name} has neither a rule nor an explained gap for {sorted(missing)}"
    assert all(plat.unsupported.values()), "every gap needs a reason"


def test_every_op_documents_its_operands() -> None:
    for op in all_ops():
        assert "`" in op.doc and "->" in op.doc, f"op {op.name}: docstring must give operand shapes"
        assert dataclasses.is_dataclass(op.params_type) and op.params_type.__dataclass_params__.frozen


def test_missing_rule_names_op_platform_and_equation() -> None:
    g = make_graph(lambda x: C.sigmoid(C.exp(x)), TensorType((2,), "f32"))
    cpu = get_platform("cpu")
    partial = Platform("partial", {k: v for k, v in cpu.rules.items() if k != "sigmoid"})
    with pytest.raises(
        LoweringError,
        match=r"op 'sigmoid' has no lowering rule on platform 'partial'.*eqn 1 .*registered ops: \[",
    ):
        lower(g, partial)
    gap = Platform("gappy", partial.rules, unsupported={"sigmoid": "not written yet"})
    with pytest.raises(LoweringError, match=r"\(not written yet\)"):
        lower(g, gap)
    with pytest.raises(LoweringError, match="unknown platform 'tpu'"):
        lower(g, "tpu")


def test_null_platform_plans_but_does_not_run() -> None:
    g = make_graph(lambda x: C.exp(x), TensorType((8, 8), "f32"))
    program = lower(g, "null")
    assert program.memory is not None and program.memory.arena_bytes == 256
    with pytest.raises(RuntimeError, match="does not execute"):
        program.steps[0].rule(None)
