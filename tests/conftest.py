"""Shared fixtures: every test that takes ``backend`` runs once per backend, skipping (with the
reason) those that cannot run on that test's tensors (where they live: docs/testing.md §On a GPU).

Without a GPU, Triton runs in its interpreter on CPU tensors: TRITON_INTERPRET=1 must be set before
any module defining @triton.jit kernels is imported, and conftest is imported before the test
modules, so setting it here covers the whole suite (with a GPU, set it yourself to interpret there).
"""
import functools
import inspect
import os

import torch  # (does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Under pytest-xdist (`-n 2`), one core's share of threads per worker: torch's default, every core
    # in every process, oversubscribes them, and OpenMP's spinning threads then wait on each other.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def _lighter_triton_interpreter():
    """Skips two pieces of Triton 3.x's interpreter bookkeeping (docs/testing.md §The interpreted Triton
    cases); what a kernel computes is unchanged. A @triton.jit helper called inside a running launch
    skips ``_patch_lang`` (the launch patched the same modules and restores them only when it ends);
    ``_get_np_dtype``'s answers are cached per dtype. Another interpreter layout is left as is."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    needed = ("_patch_lang", "_get_np_dtype", "GridExecutor", "_LangPatchScope")
    if not all(hasattr(interp, n) for n in needed) or getattr(interp, "_specops_lighter", False):
        return
    patch_lang, np_dtype, run_grid = interp._patch_lang, interp._get_np_dtype, interp.GridExecutor.__call__
    active = []  # per running launch: the ids of the language modules it has patched
    langs_of = {}

    def _patch_lang(fn):
        key = langs_of.get(fn)
        if key is None:
            key = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                           if inspect.ismodule(v) and v in (tl, tl.core))
        if active and key and key <= active[-1]:
            return interp._LangPatchScope()  # nothing to restore: the launch's patch stays
        scope = patch_lang(fn)
        if active:
            active[-1] |= key
        return scope

    def _call(self, *args, **kwargs):
        active.append(set())
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            active.pop()

    cached = functools.cache(np_dtype)

    def _get_np_dtype(tt_dtype):
        # The original's rule: a block type maps as its element type, every pointer to uint64.
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        return np_dtype(tt_dtype) if isinstance(tt_dtype, tl.pointer_type) else cached(tt_dtype)

    interp._patch_lang, interp._get_np_dtype, interp.GridExecutor.__call__ = _patch_lang, _get_np_dtype, _call
    interp._specops_lighter = True


_lighter_triton_interpreter()

import pytest

from specops import backend as _backend
from specops.testing import perturbed_copy, reference_greedy, tiny_causal_lm

CPU_ONLY = ("cpp", "cudasim")  # backends that take CPU tensors only
# Whether a backend can run depends on the test's tensors, known per test item only:
# pytest_collection_modifyitems skips the cases that cannot run (the marker names them). flashinfer
# implements only tree_attention (tests/test_backend.py), not every op.
_BACKEND_PARAMS = [pytest.param(name, id=name, marks=pytest.mark.specops_backend(name))
                   for name in _backend.BACKENDS if name != "flashinfer"]


def _test_device(fixturenames, name):
    """The device of a test's tensors for backend ``name`` (docs/testing.md §On a GPU)."""
    cpu = "device" not in fixturenames or name in CPU_ONLY or not torch.cuda.is_available()
    return "cpu" if cpu else "cuda"


def pytest_configure(config):
    config.addinivalue_line("markers", "specops_backend(name): a case of the backend / fast_backend fixtures")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (marker := item.get_closest_marker("specops_backend")) is not None:
            name = marker.args[0]
            ok, why = _backend.available(name, _test_device(item.fixturenames, name))
            if not ok:
                item.add_marker(pytest.mark.skip(reason=f"{name}: {why}"))


@pytest.fixture(params=_BACKEND_PARAMS)
def backend(request):
    """A backend name that can run on ``device``."""
    return request.param


@pytest.fixture(params=[b for b in _BACKEND_PARAMS if b.values[0] != "torch"])
def fast_backend(request):
    """A non-reference backend (what is compared against ``torch``)."""
    return request.param


@pytest.fixture
def device(request):
    """Where the test's tensors live: CUDA when a GPU is visible, except for the CPU-only backends."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    return _test_device(request.fixturenames, params.get("backend", params.get("fast_backend")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def kernel_checks(monkeypatch):
    """Every op call validates its inputs: drafters must hand the kernels well-formed trees and
    distributions (the loop itself runs with the checks off). Decoding modules opt in by name."""
    from specops.decoding import _kernels

    monkeypatch.setattr(_kernels, "CHECK", True)


def _tiny_pair(arch):
    """(target, draft, prompts, refs): a tiny random target, its draft (a perturbed copy, accepted
    part of the time), three ragged prompts and each one's greedy continuation of 24 tokens."""
    target = tiny_causal_lm(arch, seed=0)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 11, 3)]
    refs = [reference_greedy(target, p, 24) for p in prompts]
    return target, perturbed_copy(target, 0.15, seed=1), prompts, refs


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    """The decoding tests' models and prompts, once per architecture."""
    return _tiny_pair(request.param)


@pytest.fixture(scope="module")
def llama_pair():
    return _tiny_pair("llama")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls on a loaded 2-core machine: one thread avoids spin contention (100x faster here)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def pytest_runtest_logreport(report):
    """SPECOPS_FAILURE_LOG=PATH appends every failure and error, with its traceback, the moment it is
    reported (under xdist too): a run cut off by a time limit still leaves its reasons behind."""
    path = os.environ.get("SPECOPS_FAILURE_LOG")
    if not path or not report.failed:
        return
    with open(path, "a") as f:
        f.write(f"==== {report.when} {report.nodeid}\n{report.longreprtext}\n")


# A CUDA fault leaves the process's CUDA context unusable (docs/testing.md §On a GPU): the first GPU
# runs lost ~2000 tests of a worker this way after one fault.
_FAULTS = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
           "global/shared address space", "device-side assert")
_context_lost = []


def cuda_context_lost(exc):
    """Whether ``exc`` (a test's exception) says the CUDA context is gone."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and "CUDA error" in text and any(f in text for f in _FAULTS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if call.excinfo is not None and cuda_context_lost(call.excinfo.value):
        _context_lost.append(item.nodeid)


def pytest_runtest_logfinish(nodeid, location):
    """Under xdist, a worker whose CUDA context is lost exits once the faulting test is reported, and
    xdist starts a fresh one (with a fresh context) for the tests still to run."""
    if _context_lost and os.environ.get("PYTEST_XDIST_WORKER"):
        os._exit(70)
