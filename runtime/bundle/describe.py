"""`dsgraph inspect --bundle`: what a bundle holds, as text (the manifest's facts, the buckets per step
kind with their graph sizes and memory plans, the kernels, the tuned tables, the files), or one bucket's
lowered program."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsgraph.runtime.bundle import store
from dsgraph.runtime.bundle.buckets import parse_bucket_name
from dsgraph.runtime.bundle.load import open_bundle

__all__ = ["describe", "program_text"]


def _size(n: int | None) -> str:
    if n is None:
        return "symbolic"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _header(m: dict[str, Any], root: Path) -> list[str]:
    e = m["environment"]
    engine = " ".join(f"{k}={v}" for k, v in sorted(m["engine"].items()))
    caches = " ".join(f"{k}={v}" for k, v in sorted(m["cache_sizes"].items()))
    return [
        f"bundle {root} ({m['format']} v{m['version']})",
        f"built by: dsgraph {e['dsgraph']} commit {e['commit']} (sources {str(e.get('source'))[:12]}..), "
        f"torch {e['torch']}, triton {e['triton']}, cuda {e['cuda']}, arch {e['arch']}",
        f"model: {m['model_dir'] or 'the embedded tiny model'} (config.json sha256 {m['config_hash']})",
        f"engine: {engine}",
        f"expert parallel: {m['ep']} rank(s); cache sizes: {caches}",
    ]


def _buckets(m: dict[str, Any]) -> list[str]:
    lines = []
    for kind, buckets in m["buckets"].items():
        total = sum(b["graph_bytes"] for b in buckets.values())
        lines.append(f"buckets {kind}: {len(buckets)}, graphs {_size(total)}")
        for name in sorted(buckets, key=lambda n: tuple(parse_bucket_name(n).values())):
            b = buckets[name]
            lines.append(
                f"  {name:<28} graph {_size(b['graph_bytes']):>10}  arena {_size(b['arena_bytes']):>10}  "
                f"peak {_size(b['peak_bytes']):>10}"
            )
    return lines


def _kernels(m: dict[str, Any]) -> list[str]:
    k = m["kernels"]
    if not k.get("files"):
        return [f"kernels: none ({k.get('note', '')})"]
    lines = [
        f"kernels: {len(k['binaries'])} binaries, {k['files']} files, {_size(k['bytes'])} "
        f"(warmed: {', '.join(k['warmed_kinds'])}; {k['note']})"
    ]
    lines += [f"  {b['name']:<40} {_size(b['bytes']):>10}  {b['dir']}" for b in k["binaries"]]
    return lines


def _tables(m: dict[str, Any]) -> list[str]:
    t = m.get("tables", {})
    if not t:
        return ["tuned tables: none (no drafting)"]
    lines = []
    for name, (sizes, ms) in sorted(t.items()):
        points = ", ".join(f"{s}: {v:.3g} ms" for s, v in zip(sizes, ms, strict=True))
        lines.append(f"tuned table {name}: {points}")
    return lines


def describe(path: str | Path) -> str:
    bundle = open_bundle(path)
    m, root = bundle.manifest, bundle.root
    files = m["files"]
    total = sum((root / rel).stat().st_size for rel in files if (root / rel).is_file())
    lines = _header(m, root) + _buckets(m) + _kernels(m) + _tables(m)
    if (root / store.PLACEMENT).is_file():
        moes = store.read_json(root, store.PLACEMENT)["moes"]
        lines.append(f"expert placement: {len(moes)} MoEs ({store.PLACEMENT})")
    verdicts = bundle.capture_facts().get("verdicts", {})
    if verdicts:
        eager = sum(1 for ok, _ in verdicts.values() if not ok)
        lines.append(f"capture: {len(verdicts)} probed rule keys, {eager} eager ({store.CAPTURE})")
    lines.append(f"files: {len(files)} + manifest, {_size(total)}")
    return "\n".join(lines) + "\n"


def program_text(path: str | Path, kind: str, bucket: str) -> str:
    """The lowered program's text of one bucket, as compiled."""
    bundle = open_bundle(path)
    if bucket not in bundle.manifest["buckets"].get(kind, {}):
        have = {k: len(v) for k, v in bundle.manifest["buckets"].items()}
        raise ValueError(f"bundle {path}: no {kind} bucket {bucket!r} (buckets per kind: {have})")
    return store.read_text(bundle.root, store.text_path(kind, bucket))
