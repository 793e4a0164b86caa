"""The cuda platform: the cpu rules on device tensors, overridden by Triton kernel rules
(`kernels/*.py`), device execution with in-place caches (`execute.py`) and CUDA-graph capture per bucket
(`capture.py`). Importable without CUDA or triton: kernel modules that fail to import fall back."""
