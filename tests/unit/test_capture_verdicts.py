"""A bundle keeps the fake-tensor probe's verdicts (which rules can be captured), and a start that adopts
them asks the probe nothing for the keys they cover and still probes any other key."""

from __future__ import annotations

import json

import pytest

from dsgraph.platform.cuda import capture
from dsgraph.platform.registry import lower
from dsgraph.tools.inspect_cmd import example_graph, run_stages


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setattr(capture, "_PROBED", {})
    monkeypatch.setattr(capture, "_ADOPTED", {})
    return list(lower(run_stages(example_graph(), {"tokens": 4}).specialized, "cpu").steps)


def test_adopted_verdicts_replace_the_probe(steps: list, monkeypatch: pytest.MonkeyPatch) -> None:
    probed = [capture.capturable(s) for s in steps]
    assert all(why == "probed" for _, why in probed)  # cpu rules: each one went through the probe
    table = json.loads(json.dumps(capture.probed_verdicts()))  # as a bundle stores it
    assert table and all(isinstance(k, str) for k in table)

    monkeypatch.setattr(capture, "_PROBED", {})  # a fresh process

    def refuse(step: object) -> tuple[bool, str]:
        raise AssertionError("probed a key the bundle covers")

    monkeypatch.setattr(capture, "_probe", refuse)
    capture.adopt_verdicts(table)
    assert [capture.capturable(s) for s in steps] == probed


def test_a_key_the_bundle_lacks_is_still_probed(steps: list, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = capture._probe

    def counted(step):  # type: ignore[no-untyped-def]
        calls.append(step.eqn.op)
        return real(step)

    monkeypatch.setattr(capture, "_probe", counted)
    capture.adopt_verdicts({"('no such op', (), ())": (True, "probed")})
    capture.capturable(steps[0])
    assert calls == [steps[0].eqn.op]
