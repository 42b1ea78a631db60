"""Triton kernels of specops, installed as ``specops.triton_kernels``.

One module per op family (the same stem as ``specops/ops``); each holds its ``@triton.jit``
kernels, their launchers and ``AOT_SPECS`` (the signatures ``python -m
specops.triton_kernels.aot`` compiles for sm_80/sm_90 to catch GPU-only compile errors).
Modules import triton lazily: set ``TRITON_INTERPRET=1`` before importing one to run the
kernels on CPU tensors.
"""
