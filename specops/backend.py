"""One backend-dispatch rule for every op.

Precedence: the op's ``backend=`` argument, then ``specops.use_backend(name)``, then the
``SPECOPS_BACKEND`` environment variable, then the per-device preference
(CUDA device: cuda, triton, torch; CPU: cpp, torch). An explicit request (any of the first
three) that cannot be met raises :class:`BackendUnavailable` with the reason; the automatic
choice silently falls through to the next available backend.
"""
import contextlib
import functools
import os
import threading

import torch

from . import _ext

BACKENDS = ("torch", "cpp", "triton", "cuda")
PREFERENCE = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpp", "torch")}

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
