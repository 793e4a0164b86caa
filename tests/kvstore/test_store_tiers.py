"""The tiered store: survives a restart, rejects a truncated block file, evicts least recently used,
drops blocks past their TTL; and the released formats give 890 bytes of global cache per token."""

from __future__ import annotations

from pathlib import Path

from dsgraph.runtime.kvstore.config import StoreConfig
from dsgraph.runtime.kvstore.store import TieredStore

K = ["a" * 40, "b" * 40, "c" * 40]


def test_disk_tier_survives_restart_and_rejects_truncated_file(tmp_path: Path) -> None:
    TieredStore(StoreConfig(path=str(tmp_path))).put(K[0], b"x" * 100)
    again = TieredStore(StoreConfig(path=str(tmp_path)))
    assert again.get(K[0]) == b"x" * 100 and again.metrics()["disk"]["hits"] == 1
    p = again.disk.path(K[0])
    p.write_bytes(p.read_bytes()[:-3])
    third = TieredStore(StoreConfig(path=str(tmp_path)))
    assert third.get(K[0]) is None and third.metrics()["disk"]["corrupt"] == 1 and not p.exists()


def test_host_lru_eviction_and_ttl() -> None:
    now = [0.0]
    s = TieredStore(StoreConfig(host_capacity_bytes=200, host_ttl_s=10), clock=lambda: now[0])
    s.put(K[0], b"0" * 100)
    s.put(K[1], b"1" * 100)
    assert s.get(K[0]) is not None  # K[1] is now the least recently used
    s.put(K[2], b"2" * 100)
    assert s.get(K[1]) is None and s.get(K[0]) is not None and s.metrics()["host"]["evictions"] == 1
    now[0] = 11.0
    assert s.get(K[0]) is None and s.metrics()["host"]["expired"] >= 1


def test_flash_global_cache_is_890_bytes_per_token() -> None:
    from dsgraph.models.deepseek_v41.config import parse_config
    from dsgraph.models.deepseek_v41.flash import flash_config_dict
    from dsgraph.models.deepseek_v41.layers_plan import layer_plans
    from dsgraph.models.deepseek_v41.step_io import cache_types, default_geometry, global_bytes_per_token

    text = parse_config(flash_config_dict()).text
    plans = layer_plans(text)
    assert global_bytes_per_token(plans, text.head_dim, text.index_head_dim) == 890.0
    geo = default_geometry(text, 4096, 64)
    per_page = {}
    for t in cache_types(text, plans, geo).values():
        if str(t.shape[0]).startswith("blocks"):
            r = int(str(t.shape[0])[6:])
            per_page[r] = per_page.get(r, 0) + t.shape[1] * t.shape[2]
    assert sum(b / (64 * r) for r, b in per_page.items()) == 890.0
