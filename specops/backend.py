"""One backend-dispatch rule for every op.

Precedence: the op's ``backend=`` argument, then ``specops.use_backend(name)``, then the
``SPECOPS_BACKEND`` environment variable, then the per-device preference
(CUDA device: cuda, triton, torch; CPU: cpp, torch). An explicit request (any of the first
three) that cannot be met raises :class:`BackendUnavailable` with the reason; the automatic
choice silently falls through to the next available backend.

``cudasim`` is test-only: the CUDA kernels compiled as host C++ and run on CPU tensors by a SIMT
emulation (csrc/cudasim/, docs/cudasim.md). It runs only when requested explicitly.
"""
import contextlib
import functools
import os
import threading

import torch

from . import _ext

BACKENDS = ("torch", "cpp", "triton", "cuda", "cudasim")
TEST_ONLY = ("cudasim",)  # never chosen automatically
PREFERENCE = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpp", "torch")}
# The torch.ops namespace each compiled backend's kernels are registered in (csrc/schemas.h).
COMPILED = {"cpp": "specops", "cuda": "specops", "cudasim": "specops_cudasim"}

_IMPLS = {}  # op name -> {backend name -> callable}
_local = threading.local()  # per-thread stack of use_backend() requests


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot run this op on this device."""


def register(op, backend):
    """Decorator: ``fn`` implements ``op`` on ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def wrap(fn):
        _IMPLS.setdefault(op, {})[backend] = fn
        return fn

    return wrap


def register_compiled(op):
    """Decorator: ``call(ns, *args)`` runs ``op`` from the torch.ops namespace ``ns``; registered
    for every compiled backend (``torch.ops.specops`` dispatches to the CPU or CUDA kernel by
    device; ``torch.ops.specops_cudasim`` holds the emulated CUDA kernels)."""

    def wrap(call):
        for name, ns in COMPILED.items():
            register(op, name)(functools.partial(call, getattr(torch.ops, ns)))
        return call

    return wrap


def _interpret():
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _triton_importable():
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return False, f"triton not importable ({err})"
    return True, f"triton {triton.__version__}"


_AVAILABLE = {}  # (backend, device type, interpret) -> (ok, reason); a plain dict so dynamo traces it


def _available(backend, device_type, interpret):
    key = (backend, device_type, interpret)
    if key not in _AVAILABLE:
        _AVAILABLE[key] = _probe(backend, device_type, interpret)
    return _AVAILABLE[key]


def _probe(backend, device_type, interpret):
    if backend == "torch":
        return True, "reference implementation, always available"
    if backend == "cpp":
        if _ext.cpu_ext is None:
            return False, _ext.cpu_ext_error
        if device_type != "cpu":
            return False, f"CPU extension; tensors are on {device_type}"
        return True, "CPU extension (OpenMP / at::parallel_for)"
    if backend == "triton":
        ok, why = _triton_importable()
        if not ok:
            return False, why
        if device_type == "cuda":
            if not torch.cuda.is_available():
                return False, f"{why}; no CUDA device visible"
            return True, why
        if device_type == "cpu":
            if interpret:
                return True, f"{why} under TRITON_INTERPRET=1 (interpreter, slow)"
            return False, f"{why}; CPU tensors need TRITON_INTERPRET=1"
        return False, f"{why}; no Triton backend for {device_type}"
    if backend == "cuda":
        if _ext.cuda_ext is None:
            return False, _ext.cuda_ext_error
        built = f"extension built for {', '.join(_ext.cuda_archs()) or 'no arch'}"
        if not torch.cuda.is_available():
            return False, f"{built}; no CUDA device visible"
        if device_type != "cuda":
            return False, f"{built}; tensors are on {device_type}"
        return True, built
    if backend == "cudasim":
        if _ext.cudasim_ext is None:
            return False, _ext.cudasim_ext_error
        if device_type != "cpu":
            return False, f"test-only CUDA emulation on CPU tensors; tensors are on {device_type}"
        return True, ("test-only: the CUDA kernels compiled as C++ and run by a SIMT emulation on CPU "
                      "tensors (slow; only when requested)")
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def available(backend, device="cpu"):
    """``(ok, reason)``: can ``backend`` run on ``device`` (a torch.device or its type)?"""
    device_type = torch.device(device).type
    return _available(backend, device_type, _interpret())


def _requested(backend):
    if backend is not None:
        return backend, "backend="
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1], "specops.use_backend"
    env = os.environ.get("SPECOPS_BACKEND")
    if env:
        return env, "SPECOPS_BACKEND"
    return None, None


def resolve(op, device, backend=None):
    """The implementation of ``op`` to run on ``device``, following the dispatch rule."""
    impls = _IMPLS[op]
    want, source = _requested(backend)
    if want is not None:
        if want not in BACKENDS:
            raise ValueError(f"{source} must name one of {BACKENDS}, got {want!r}")
        ok, why = available(want, device)
        if ok and want not in impls:
            ok, why = False, f"{op} has no {want} implementation"
        if not ok:
            raise BackendUnavailable(f"{op}: backend {want!r} ({source}) unavailable on {device}: {why}")
        return impls[want]
    device_type = torch.device(device).type
    for name in PREFERENCE.get(device_type, ("torch",)):
        if name in impls and available(name, device_type)[0]:
            return impls[name]
    raise BackendUnavailable(f"{op}: no backend available on {device}")


@contextlib.contextmanager
def use_backend(name):
    """Run the ops in this block (and this thread) on backend ``name`` unless an op says otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"use_backend(name) must be one of {BACKENDS}, got {name!r}")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def implementations(op):
    """The backends that implement ``op`` (available here or not)."""
    return tuple(b for b in BACKENDS if b in _IMPLS.get(op, {}))


def ops():
    return tuple(sorted(_IMPLS))
