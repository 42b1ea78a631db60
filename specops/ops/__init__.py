"""Public ops, one module per family stem (the same stem in csrc/, triton_kernels/, tests/, bench/)."""
