"""The structured-output overhead bench runs on the cuda platform (issue 20's H200 measurement): mask fill,
upload, matcher updates and masked sampling are measured with the logits on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.gpu
def test_structured_overhead_runs_on_cuda(tmp_path: Path) -> None:
    # the GPU machine installs dsgraph without its dependencies; xgrammar compiles the grammars
    pytest.importorskip("xgrammar", reason="xgrammar (a dependency of structured output) is not installed")
    from dsgraph.tools.bench.structured_overhead import main

    out = tmp_path / "overhead.json"
    main(["--platform", "cuda", "--rows", "1", "4", "--reps", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["platform"] == "cuda"
    for row in result["rows"].values():
        assert all(v >= 0 for k, v in row.items() if k != "overhead_ms"), row
        assert row["sample_masked_ms"] > 0
