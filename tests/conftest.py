"""Shared fixtures: every test that takes ``backend`` runs once per backend, skipping (with the
reason) those that cannot run on this machine's CPU tensors.

TRITON_INTERPRET=1 must be set before any module defining @triton.jit kernels is imported;
conftest is imported before the test modules, so setting it here covers the whole suite.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import specops  # noqa: E402
from specops import backend as _backend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# flashinfer implements only tree_attention (tests/test_flashinfer.py), not every op
KERNEL_BACKENDS = tuple(b for b in _backend.BACKENDS if b != "flashinfer")


def _backend_params(op_backends=KERNEL_BACKENDS):
    params = []
    for name in op_backends:
        ok, why = _backend.available(name, DEVICE)
        marks = () if ok else (pytest.mark.skip(reason=f"{name}: {why}"),)
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(params=_backend_params())
def backend(request):
    """A backend name that can run on ``device``."""
    return request.param


@pytest.fixture(params=[b for b in _backend_params() if b.values[0] != "torch"])
def fast_backend(request):
    """A non-reference backend (what is compared against ``torch``)."""
    return request.param


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def kernel_checks(monkeypatch):
    """Every op call validates its inputs: drafters must hand the kernels well-formed trees and
    distributions (the loop itself runs with the checks off). Decoding modules opt in by name."""
    from specops.decoding import _kernels

    monkeypatch.setattr(_kernels, "CHECK", True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls on a loaded 2-core machine: one thread avoids spin contention (100x faster here)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
