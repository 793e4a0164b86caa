"""The H200 handoff benchmark (tools/bench/pd_handoff.py) runs end to end at a tiny size on CPU: its
handoff carries the released formats' global bytes per token and its JSON is written."""

from __future__ import annotations

import json
from pathlib import Path

from dsgraph.tools.bench.pd_handoff import main


def test_pd_handoff_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "pd.json"
    args = ["--lengths", "40", "--decode-tokens", "2", "--store-mib", "1", "--transport", "torch"]
    main([*args, "--out", str(out), "--store-dir", str(tmp_path / "store")])
    got = json.loads(out.read_text())
    (h,) = got["handoff"]
    assert got["flash_global_bytes_per_token"] == 890.0
    assert h["global_bytes_per_token"] == got["expected_global_bytes_per_token"] > 0
    assert h["decode_tokens"] == 2 and h["store_keys"] == 3 and h["transfer_bytes"] > h["slot_bytes"]
    assert got["store"]["blocks"] == 256 and got["store"]["disk_read_MBps"] > 0
