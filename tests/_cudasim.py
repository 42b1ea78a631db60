"""What the tests that run CUDA kernels in the cudasim emulator share (docs/cudasim.md): the extension,
whether its racecheck instrumentation is built, the emulator's controls restored after a test, and the
check that a call's result does not depend on the order the emulated threads run in."""
import contextlib

import pytest
import torch

from specops import extension as _ext

sim = _ext.cudasim_ext
needs_sim = pytest.mark.skipif(sim is None, reason=f"cudasim: {_ext.cudasim_ext_error}")


def racecheck_built():
    was = sim.racecheck()
    try:
        sim.set_racecheck(True)
    except RuntimeError:  # an ASan build (SPECOPS_SANITIZE=1) has no instrumentation
        return False
    sim.set_racecheck(was)
    return True


needs_racecheck = pytest.mark.skipif(sim is None or not racecheck_built(),
                                     reason="cudasim built without racecheck's instrumentation")


@contextlib.contextmanager
def restored():
    """The emulator's thread order, racecheck, cp.async landing and arch as the block leaves them: back
    to forward, as before, late (at the wait) and 90 afterwards."""
    was = sim.racecheck()
    try:
        yield sim
    finally:
        sim.set_schedule("forward")
        sim.set_racecheck(was)
        sim.set_cp_async("late")
        sim.set_arch(90)


def assert_same_bits(want, got, why):
    for w, o in zip(*((x if isinstance(x, tuple) else (x,)) for x in (want, got))):  # one output or several
        assert torch.equal(w, o), why


def assert_order_independent(case, orders, want=None):
    """``case()`` gives ``want`` (default: its forward-order result) bit for bit under each (order, seed)
    of the emulator's thread schedules. Returns ``want``."""
    want = case() if want is None else want
    with restored():
        for order, seed in orders:
            sim.set_schedule(order, seed)
            assert_same_bits(want, case(), f"{order}/{seed} differs from the forward order")
    return want
