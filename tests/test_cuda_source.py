"""Rules of the CUDA sources that no emulator run can check, checked on the source, and how the suite tells
a CUDA fault from other errors. Writable kernel pointers are never ``__restrict__``: nvcc may then move
loads across a barrier, which broke the CUDA ``mss`` walks on an H200 and which the emulator cannot show
(docs/cudasim.md, "What it proves, and what it cannot"); ``const T* __restrict__`` inputs stay."""
import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
# A restrict-qualified pointer declaration (__restrict__ or __restrict) and the type words before it
# (up to the last , ( or ;).
RESTRICT = re.compile(r"(?:^|[,(;])\s*(?P<decl>[^,(;]*?)\*\s*__restrict(?:__)?\s+(?P<name>\w+)", re.M)


def writable_restrict(text):
    """The names of restrict pointers in ``text`` whose pointee is not const."""
    return [m.group("name") for m in RESTRICT.finditer(text)
            if "const" not in re.sub(r"//.*", "", m.group("decl")).split()]


def test_the_scan_finds_a_writable_restrict_pointer():
    text = ("__global__ void k(const float* __restrict__ x,  // [N]\n"
            "                  float* __restrict__ scratch,  // [N]\n"
            "                  const WarpRowStats* __restrict__ s, int32_t* __restrict__ out, T* __restrict y) {}")
    assert writable_restrict(text) == ["scratch", "out", "y"]


@pytest.mark.parametrize("path", sorted(CSRC.glob("*.cu*")), ids=lambda p: p.name)
def test_no_writable_kernel_pointer_is_restrict(path):
    assert writable_restrict(path.read_text()) == [], f"{path.name}: drop __restrict__ (docs/cudasim.md)"


def test_the_scan_sees_the_kernels():
    assert len(list(CSRC.glob("*.cu"))) >= 8
    assert sum(len(RESTRICT.findall(p.read_text())) for p in CSRC.glob("*.cu*")) > 40  # the const inputs


def test_a_cuda_fault_is_told_apart_from_other_errors():
    # tests/conftest.py: an xdist worker whose CUDA context is lost exits and is replaced.
    from conftest import cuda_context_lost

    assert cuda_context_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert cuda_context_lost(RuntimeError("CUDA error: operation not supported on global/shared address space"))
    assert not cuda_context_lost(RuntimeError("CUDA error: out of memory"))
    assert not cuda_context_lost(ValueError("illegal memory access"))
