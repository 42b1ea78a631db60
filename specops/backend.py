"""One backend-dispatch rule for every op (README §Backends: ``backend=``, ``use_backend``,
``SPECOPS_BACKEND``, then the op's preference on the device). A backend runs a call when available on the
device (built, device visible) and capable of it (its ``supports`` check: head dim, dtype, sizes). An
explicit request that cannot be met raises the reason; the automatic choice falls through to the next."""
import contextlib
import functools
import importlib.util
import os
import threading

import torch

from . import extension

BACKENDS = ("torch", "cpp", "triton", "cuda", "cudasim", "flashinfer")
# flashinfer: an optional external provider of tree_attention (specops/integrations/flashinfer.py)
TEST_ONLY = ("cudasim",)  # never chosen automatically
PREFERENCE = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpp", "torch")}
# Ops whose preference differs from the device's. tree_attention: Triton's kernel runs on tensor cores;
# flashinfer, after our kernels, reads K/V over the whole buffer, one launch per sequence (integrations/
# flashinfer.py).
OP_PREFERENCE = {("tree_attention", "cuda"): ("triton", "cuda", "flashinfer", "torch"),
                 ("tree_attention_paged", "cuda"): ("triton", "cuda", "torch")}
# The torch.ops namespace each compiled backend's kernels are registered in (csrc/schemas.h).
COMPILED = {"cpp": "specops", "cuda": "specops", "cudasim": "specops_cudasim"}

_IMPLS = {}  # op name -> {backend name -> callable}
_SUPPORTS = {}  # (op, backend) -> supports(*args) -> None (can run the call) or the reason it cannot
_local = threading.local()  # per-thread stack of use_backend() requests


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot run this op on this device."""


class CallUnsupported(BackendUnavailable, ValueError):
    """An explicitly requested backend cannot take this call's arguments (one of its limits, e.g. the
    cuda kernels' head dim): bad input for that backend, so also a ``ValueError`` naming the argument."""


def register(op, backend, supports=None):
    """Decorator: ``fn`` implements ``op`` on ``backend``. ``supports(*args)`` gets ``fn``'s arguments
    and returns None when ``fn`` can run them, else the reason; it must not sync with the device."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def wrap(fn):
        _IMPLS.setdefault(op, {})[backend] = fn
        if supports is not None:
            _SUPPORTS[(op, backend)] = supports
        return fn

    return wrap


def register_supports(op, backends, supports):
    """Sets the capability check of ``op`` on each of ``backends`` (see :func:`register`)."""
    for name in backends:
        _SUPPORTS[(op, name)] = supports


def register_op(op, reference, triton=None, fake=None, fake_names=()):
    """The usual backends of ``op``: ``reference`` on torch; ``torch.ops.<ns>.<op>`` of every compiled
    backend (``specops`` dispatches to the CPU or CUDA kernel by device); ``triton`` (imports its
    kernel module at the call, a plain import torch.compile can trace: triton is optional); ``fake``,
    the torch.library fake of ``specops::<op>`` (and ``<op>.<each of fake_names>``) where defined."""
    register(op, "torch")(reference)
    for name, ns in COMPILED.items():
        register(op, name)(functools.partial(lambda namespace, *args: getattr(namespace, op)(*args),
                                             getattr(torch.ops, ns)))
    if triton is not None:
        register(op, "triton")(triton)
    if fake is not None and (extension.cpu_ext is not None or extension.cuda_ext is not None) and extension.has_op(op):
        for name in (op, *(f"{op}.{n}" for n in fake_names)):
            torch.library.register_fake(f"specops::{name}")(fake)


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


def _probe(backend, device_type, interpret, assume_gpu=False):
    """(ok, the first unmet requirement or what runs) of ``backend`` on ``device_type``;
    ``assume_gpu``: as if a CUDA device were visible."""
    gpu = assume_gpu or torch.cuda.is_available()
    on = f"tensors are on {device_type}"
    if backend == "torch":
        return True, "reference implementation, always available"
    if backend == "cpp":
        ok = "CPU extension (OpenMP / at::parallel_for)"
        needs = [(extension.cpu_ext is not None, extension.cpu_ext_error),
                 (device_type == "cpu", f"CPU extension; {on}")]
    elif backend == "triton":
        found, why = _triton_importable()
        ok = f"{why} under TRITON_INTERPRET=1 (interpreter, slow)" if device_type == "cpu" else why
        needs = [(found, why),
                 (device_type in ("cuda", "cpu"), f"{why}; no Triton backend for {device_type}"),
                 (gpu or device_type != "cuda", f"{why}; no CUDA device visible"),
                 (interpret or device_type != "cpu", f"{why}; CPU tensors need TRITON_INTERPRET=1")]
    elif backend == "cuda":
        ok = f"extension built for {', '.join(extension.cuda_archs()) or 'no arch'}"
        needs = [(extension.cuda_ext is not None, extension.cuda_ext_error),
                 (gpu, f"{ok}; no CUDA device visible"),
                 (device_type == "cuda", f"{ok}; {on}")]
    elif backend == "flashinfer":
        ok = "flashinfer installed (custom-mask prefill)"
        needs = [(importlib.util.find_spec("flashinfer") is not None,
                  "optional provider: flashinfer not installed"),
                 (device_type == "cuda", f"flashinfer runs on CUDA tensors; {on}"),
                 (gpu, "flashinfer installed; no CUDA device visible")]
    elif backend == "cudasim":
        ok = ("test-only: the CUDA kernels compiled as C++ and run by a SIMT emulation on CPU tensors "
              "(slow; only when requested)")
        needs = [(extension.cudasim_ext is not None, extension.cudasim_ext_error),
                 (device_type == "cpu", f"test-only CUDA emulation on CPU tensors; {on}")]
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return next(((False, why) for met, why in needs if not met), (True, ok))


def available(backend, device="cpu"):
    """``(ok, reason)``: can ``backend`` run on ``device`` (a torch.device or its type)?"""
    key = (backend, torch.device(device).type, _interpret())
    if key not in _AVAILABLE:
        _AVAILABLE[key] = _probe(*key)
    return _AVAILABLE[key]


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


def preference(op, device_type):
    """The order in which the automatic choice tries backends for ``op`` on ``device_type``."""
    return OP_PREFERENCE.get((op, device_type), PREFERENCE.get(device_type, ("torch",)))


def incapable(op, name, args):
    """Why backend ``name`` cannot run ``op`` on the call ``args`` by its capability check, or None
    (it can, it has no check, or ``args`` is None)."""
    check = _SUPPORTS.get((op, name))
    return None if check is None or args is None else check(*args)


def resolve(op, device, backend=None, args=None):
    """The implementation of ``op`` on ``device`` for the call ``args`` (None: no capability checks)."""
    return resolve_named(op, device, backend, args)[1]


# The resolution of calls no capability check takes part in, by (op, device, requested backend, for triton
# whether interpreted): the rule walked once per key, not per call (a one-row GEMM runs in ~10 us on CPU, the
# walk ~5-10 us). A hit is re-validated against the registries: a registration or monkeypatch is never stale.
_RESOLVED = {}


def resolve_named(op, device, backend=None, args=None):
    """:func:`resolve` as (backend name, implementation)."""
    want, source = _requested(backend)
    if want is not None and want not in BACKENDS:
        raise ValueError(f"{source} must name one of {BACKENDS}, got {want!r}")
    key = (op, device, want, want == "triton" and _interpret())
    hit = _RESOLVED.get(key)
    if hit is not None:
        name, impl, n_impls = hit
        impls = _IMPLS[op]
        if impls.get(name) is impl and len(impls) == n_impls and (op, name) not in _SUPPORTS:
            return name, impl
    name, impl, checked = _walk(op, device, want, source, args)
    if not checked and not torch.compiler.is_compiling():
        _RESOLVED[key] = (name, impl, len(_IMPLS[op]))
    return name, impl


def _walk(op, device, want, source, args):
    """The dispatch rule for a request ``want`` (None: the automatic choice) from ``source``:
    (name, implementation, whether a capability check took part)."""
    impls = _IMPLS[op]
    if want is not None:
        ok, why = available(want, device)
        if ok and want not in impls:
            ok, why = False, f"{op} has no {want} implementation"
        if not ok:
            raise BackendUnavailable(f"{op}: backend {want!r} ({source}) unavailable on {device}: {why}")
        why = incapable(op, want, args)
        if why is not None:
            raise CallUnsupported(f"{op}: backend {want!r} ({source}) cannot run this call: {why}")
        return want, impls[want], (op, want) in _SUPPORTS
    device_type = torch.device(device).type
    skipped, checked = [], False
    for name in preference(op, device_type):
        if name not in impls or not available(name, device_type)[0]:
            continue
        checked = checked or (op, name) in _SUPPORTS
        why = incapable(op, name, args)
        if why is None:
            return name, impls[name], checked
        skipped.append(f"{name}: {why}")
    raise BackendUnavailable(f"{op}: no backend available on {device}" + (f" ({'; '.join(skipped)})" if skipped else ""))


def default_backend(op_name, device_type):
    """The backend ``op_name`` runs on by default for ``device_type`` ("cuda" or "cpu") tensors where
    such a device is visible: the first of its preference that implements it and is installed."""
    if op_name not in _IMPLS:
        raise ValueError(f"op_name must be one of {ops()}, got {op_name!r}")
    if device_type not in PREFERENCE:
        raise ValueError(f"device_type must be one of {tuple(PREFERENCE)}, got {device_type!r}")
    installed = (name for name in preference(op_name, device_type) if name in _IMPLS[op_name]
                 and _probe(name, device_type, _interpret(), assume_gpu=True)[0])
    return next(installed, "torch")


@contextlib.contextmanager
def use_backend(name):
    """Run the ops in this block (and this thread) on backend ``name`` unless an op says otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"use_backend(name) must be one of {BACKENDS}, got {name!r}")
    stack = _local.__dict__.setdefault("stack", [])  # this thread's
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
