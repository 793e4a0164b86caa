"""Re-derive the traffic-model fields of a saved bench result (bytes a decode step must read, and their
fraction of the measured copy bandwidth) from its measured times, with the current traffic model.
The times are the measurement; bytes are arithmetic on the config, so they can be recomputed offline.
Usage: python -m dsgraph.tools.bench.rederive RESULT.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsgraph.models.deepseek_v41.dummy_weights import meta_serving_weights
from dsgraph.tools.bench.model_bench import make_model
from dsgraph.tools.bench.model_config import bench_config
from dsgraph.tools.bench.traffic import decode_bytes


def rederive(path: Path, note: str) -> None:
    result = json.loads(path.read_text())
    cfg = bench_config()
    weights = meta_serving_weights(cfg)
    copy = result["calibration"]["copy_gbps"]
    for row in result.get("model", {}).get("decode", []):
        if "ms" not in row:
            continue
        model = make_model(cfg, row["context"] + 64)
        nbytes = decode_bytes(model, weights, row["batch"], row["context"])
        row["bytes_read"] = nbytes
        row["fraction_of_copy_bandwidth"] = nbytes / (row["ms"] * 1e-3) / 1e9 / copy
    result["traffic_rederived"] = note
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    rederive(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "traffic model of this commit")
