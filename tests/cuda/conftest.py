"""Kernel tests run on CUDA when present, else under Triton's interpreter on the CPU: TRITON_INTERPRET
must be set before triton is first imported, which is why it is set here, when pytest loads this file
(before any test module of the folder imports a kernel)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
