"""What the op tests share: comparing outputs, the bytes of inputs a rejected call must leave alone,
and the skip of tests that need the compiled CPU extension."""
import pytest
import torch

from specops import backend as _backend

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0], reason=_backend.available("cpp")[1])


def raw(t):
    """Every byte of a tensor's storage (not just its view): uint8 [nbytes]."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def raises(exc, parts, fn, *inputs):
    """``fn()`` raises ``exc`` whose message holds every string of ``parts``, and leaves every byte
    of ``inputs`` as it was."""
    before = [raw(t).clone() for t in inputs]
    with pytest.raises(exc) as info:
        fn()
    for part in parts:
        assert part in str(info.value), f"{part!r} missing from the message: {info.value}"
    for i, (t, b) in enumerate(zip(inputs, before)):
        assert torch.equal(raw(t), b), f"input {i} changed although the call raised"
    return info


def assert_same(got, want, dtype=None):
    """Tuples of outputs equal bit for bit (of ``dtype`` where given), wherever they live."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and (dtype is None or g.dtype == dtype), (g.dtype, w.dtype)
        assert torch.equal(g.cpu(), w.cpu()), f"\n{g}\n{w}"


def to_device(args, device):
    """Moves CPU tensors to ``device`` keeping their exact layout (strides, offsets) and aliasing:
    arguments sharing a storage (k_cache and v_cache of one tensor) share one device storage."""
    if torch.device(device).type == "cpu":
        return args
    moved, out = {}, {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            storage = v.untyped_storage()
            if storage.data_ptr() not in moved:
                moved[storage.data_ptr()] = raw(v).to(device).untyped_storage()  # every byte, [nbytes] uint8
            v = torch.empty(0, dtype=v.dtype, device=device).set_(moved[storage.data_ptr()], v.storage_offset(),
                                                                   v.shape, v.stride())
        out[k] = v
    return out
