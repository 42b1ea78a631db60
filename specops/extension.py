"""Loads the compiled extensions once (running their TORCH_LIBRARY registrations) and remembers why
one is missing; nothing here probes devices."""
import importlib

import torch  # loads libc10/libtorch, which the extensions link against


def _check_torch_version():
    """The extensions link against the exact torch they were compiled with; another torch fails at
    load time with an undefined symbol or, worse, loads and misbehaves. Raise a clear error first."""
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:  # not built by setup.py (e.g. CMake): nothing recorded, nothing to check
        return
    if TORCH_VERSION != torch.__version__:
        raise ImportError(f"specops' compiled extensions were built against torch {TORCH_VERSION}, but torch "
                          f"{torch.__version__} is installed: rebuild them against this torch with "
                          f"`pip install --no-build-isolation -e .` (or `python setup.py build_ext --inplace`) "
                          f"in the specops checkout (docs/building.md)")


def _load(name):
    try:
        return importlib.import_module(f"specops.{name}"), None
    except ImportError as err:  # not built, or built against another torch
        return None, f"specops.{name} not importable ({err})"


_check_torch_version()
# _C defines the specops:: schemas (csrc/schemas.h), so it loads before _C_cuda. _C_cudasim (the
# test-only CUDA emulation) defines its own specops_cudasim:: namespace.
cpu_ext, cpu_ext_error = _load("_C")
cuda_ext, cuda_ext_error = _load("_C_cuda")
cudasim_ext, cudasim_ext_error = _load("_C_cudasim")


def has_op(name):
    """The compiled extension defines ``specops::<name>`` (an older build may not)."""
    try:
        getattr(torch.ops.specops, name).default  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def cuda_archs():
    """The SM architectures the CUDA extension was compiled for, e.g. ["sm_80", "sm_90"]."""
    if cuda_ext is None:
        return []
    return [f"sm_{a[2:]}" for a in cuda_ext.build_info()["cuda_archs"].split("_") if a.startswith("sm")]
