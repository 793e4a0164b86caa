"""`Session.load(bundle)` and the engine's use of a bundle: check it against this machine and run, point
Triton at its kernels, then load the weights; the session and sampler take their graphs from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsgraph.runtime.bundle.load import Bundle, open_bundle

__all__ = ["load_session", "open_for_engine"]


def open_for_engine(config: Any, model_dir: Path, ep: int = 1) -> Bundle:
    """The checked bundle of `config.bundle`, Triton's cache pointed at its kernels (before any weight is
    read: a mismatch costs no load)."""
    bundle = open_bundle(config.bundle)
    bundle.check(config, model_dir, ep)
    bundle.point_kernels()
    return bundle


def load_session(cls: Any, path: str | Path, model_dir: str | Path | None, config: Any) -> Any:
    from dsgraph.platform.registry import resolve_device
    from dsgraph.runtime.checkpoint_load import cache_sizes, load_model_dir

    bundle = open_bundle(path)
    config = bundle.engine_config() if config is None else config
    if config.bundle is None:
        from dataclasses import replace

        config = replace(config, bundle=str(path))
    root = bundle.model_dir() if model_dir is None else Path(model_dir)
    resolve_device(config.platform)  # an absent device fails here, before any check or weight read
    bundle.check(config, root)
    bundle.point_kernels()
    loaded = load_model_dir(root, config)
    geo_model = _target(loaded, config, bundle.drafting)
    sizes = cache_sizes(geo_model, config)
    session = cls(geo_model, loaded.weights, sizes, platform=config.platform, cuda=config.cuda, bundle=bundle)
    session.tokenizer = loaded.tokenizer
    return session


def _target(loaded: Any, config: Any, dspark: bool) -> Any:
    from dsgraph.models.interface import default_geometry

    geo = default_geometry(loaded.cfg.text, config.max_model_len, config.cache.page_size)
    return loaded.family.build(loaded.cfg, loaded.tokenizer, loaded.num, geo, dspark, config.truncation.mode)
