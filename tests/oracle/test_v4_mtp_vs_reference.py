"""The V4 MTP draft layer (models/deepseek_v4/mtp.py) against an independent reference, CPU FP32.

transformers does not implement the MTP layer, so the reference is written here from DeepSeek-V3's MTP
design: x = eh_proj([hnorm(h); enorm(embed(t))]) in plain torch, then transformers' own V4 decoder block,
final stream collapse, norm and head, i.e. a one-layer DeepseekV4ForCausalLM run on `inputs_embeds = x`
whose layer, norm and hc_head are the MTP layer's tensors (the embedding is unused there). Our graph runs
the rows in two chunks, so the second chunk's attention reads the first chunk's keys from its ring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4")

from dsgraph.graph.passes import specialize  # noqa: E402
from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors  # noqa: E402
from dsgraph.models.deepseek_v4.config import load_config, parse_config  # noqa: E402
from dsgraph.models.deepseek_v4.model import build_model  # noqa: E402
from dsgraph.models.deepseek_v4.mtp import mtp_cache_types, mtp_tensors, trace_mtp  # noqa: E402
from dsgraph.models.deepseek_v4.tiny import make_tiny, tiny_config_dict  # noqa: E402
from dsgraph.models.deepseek_v4.weights import prepare_weights  # noqa: E402
from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint, write_checkpoint  # noqa: E402
from dsgraph.models.interface import REFERENCE, default_geometry, weight_types  # noqa: E402
from dsgraph.platform.cpu.interpret import run_program  # noqa: E402
from dsgraph.platform.registry import lower  # noqa: E402
from dsgraph.tools.bench.v4_transformers import load_tf_model  # noqa: E402

TOL = 5e-6  # max |diff| <= TOL * max |logit|, as the backbone's oracle tests
ROWS, SPLIT = 13, 6  # a window of 8: the second chunk wraps the ring


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = Path(
        make_tiny(
            tmp_path_factory.mktemp("v4-mtp") / "tiny", seed=2, overrides={"num_nextn_predict_layers": 1}
        )
    )
    cfg = load_config(root)
    specs = {**expected_tensors(cfg), **mtp_tensors(cfg)}
    return root, cfg, load_checkpoint(root, cfg, progress=False, expected=specs, skipped=lambda _n: False)


def _reference_model(stored_ckpt, tmp: Path):  # type: ignore[no-untyped-def]
    """transformers' one-layer model whose layer, norm and hc_head are the MTP layer's tensors."""
    _root, _cfg, st = stored_ckpt
    cfg_dict = tiny_config_dict(
        num_hidden_layers=1, compress_ratios=[0], num_hash_layers=0, num_nextn_predict_layers=0
    )
    one = parse_config(cfg_dict)
    tensors = {}
    for name in expected_tensors(one):
        src = name
        if name.startswith("layers.0."):
            src = "mtp.0." + name.removeprefix("layers.0.")
        elif name.startswith(("norm.", "hc_head_")):
            src = "mtp.0." + name
        tensors[name] = st[src]
    out = write_checkpoint(tmp / "one-layer", tensors, cfg_dict)
    return load_tf_model(out, json.loads((out / "config.json").read_text()), one)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _ours(cfg, weights, tokens, hidden):  # type: ignore[no-untyped-def]
    model = build_model(cfg, REFERENCE, default_geometry(cfg.text, 64, page_size=8))
    graph = trace_mtp(model, weight_types(weights, backbone_only=False))
    caches = {}
    for name, ty in mtp_cache_types(model).items():
        caches[name] = torch.zeros((1, *ty.shape[1:]), dtype=torch.uint8)
    logits = []
    for lo, hi in ((0, SPLIT), (SPLIT, ROWS)):
        n = hi - lo
        prog = lower(specialize(graph, {"slots": 1, "tokens": n, "seqs": 1, "outs": n}), "cpu")
        i32 = torch.int32
        step = {
            "token_ids": tokens[lo:hi].to(i32),
            "positions": torch.arange(lo, hi, dtype=i32),
            "seq_ids": torch.zeros(n, dtype=i32),
            "seq_slot": torch.zeros(1, dtype=i32),
            "seq_start": torch.tensor([lo], dtype=i32),
            "seq_end": torch.tensor([hi], dtype=i32),
            "seq_window_start": torch.zeros(1, dtype=i32),
            "sample_rows": torch.arange(n, dtype=i32),
            "hidden": hidden[lo:hi],
        }
        args = {f"weights.{k}": v for k, v in weights.items()}
        args.update({f"caches.{k}": v for k, v in caches.items()})
        args.update({f"step.{k}": v for k, v in step.items()})
        out = run_program(prog, args)
        caches = {k: out[f"caches.{k}"] for k in caches}
        logits.append(out["logits"])
    return torch.cat(logits)


def test_mtp_logits_match_the_reference(stored, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _root, cfg, st = stored
    t = cfg.text
    weights = prepare_weights(cfg, st, REFERENCE, {**mtp_tensors(cfg)})
    weights["embed.weight"], weights["head.weight"] = st["embed.weight"].float(), st["head.weight"].float()
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, t.vocab_size, (ROWS,), generator=gen)
    hidden = torch.randn(ROWS, t.hidden_size, generator=gen)

    eps = float(t.rms_norm_eps)
    e = _rms(weights["embed.weight"][tokens], weights["mtp.0.enorm.weight"], eps)
    g = _rms(hidden, weights["mtp.0.hnorm.weight"], eps)
    x = torch.cat([g, e], dim=-1) @ weights["mtp.0.eh_proj.weight"].T
    tf = _reference_model(stored, tmp_path)
    with torch.no_grad():
        want = (
            tf(inputs_embeds=x[None], position_ids=torch.arange(ROWS)[None], use_cache=False)
            .logits[0]
            .float()
        )

    got = _ours(cfg, weights, tokens, hidden)
    assert got.shape == want.shape == (ROWS, t.vocab_size)
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= TOL, f"MTP logits differ from the reference by {err:.2e} of their largest value"
