"""DeepEP (github.com/deepseek-ai/DeepEP): NVLink/RDMA dispatch and combine kernels, the intended fast
path of the exchange on GPUs. It is not a dependency (it builds against NVSHMEM for one CUDA and torch
version), so it is probed, never assumed: `status()` says whether `import deep_ep` works here and why
not. The exchange itself is the torch.distributed all-to-all (exchange.py) on every platform until a
DeepEP exchange lands; its kernels combine in BF16, so it would be an explicit option with its error
stated, never the silent default of a path that is bit-exact today."""

from __future__ import annotations

import importlib


def status() -> str:
    """'deep_ep <version> imports' or the reason it does not ('not installed: ...')."""
    try:
        mod = importlib.import_module("deep_ep")
    except ImportError as exc:
        return f"deep_ep not importable ({exc}): the exchange is the torch.distributed all-to-all"
    return f"deep_ep {getattr(mod, '__version__', '(no version)')} imports; the exchange still uses torch"
