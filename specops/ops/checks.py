"""Argument validation shared by every op: errors name the argument, the expectation and what came
(the value, and for tensors the position of the first offending element).

Metadata checks (type, dtype, rank, shape, device) never touch tensor values. Value checks
(``tree_values``, ``range_values``, ``finite_values``) need one host sync and run only when an
op's ``check=True``.
"""
import numbers

import torch


def tensor(name, t, *, dtype=None, rank=None, shape=None, device=None, last_stride_one=False):
    """Checks one tensor argument. ``dtype`` may be a dtype or a tuple of allowed dtypes;
    ``shape`` a tuple whose ``None`` entries are free."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must have dtype {want}, got {t.dtype}")
    if rank is None and shape is not None:
        rank = len(shape)
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
    if shape is not None:
        for got, want in zip(t.shape, shape):
            if want is not None and got != want:
                expect = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
                raise ValueError(f"{name} must have shape {expect}, got {tuple(t.shape)}")
    if device is not None and t.device != (device if isinstance(device, torch.device) else torch.device(device)):
        raise ValueError(f"{name} must be on {device} (with the other inputs), got {t.device}")
    if last_stride_one and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {t.stride()}")
    return t


def integer(name, value, lo=None, hi=None, why=""):
    """A Python integer argument (bool is rejected) in ``[lo, hi]`` (``None``: unbounded);
    ``why`` explains the upper bound. Returns it as an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}{' (' + why + ')' if why else ''}, got {value}")
    return value


def byte_range(t):
    """(storage address, first byte, one past the last byte) a non-empty tensor addresses: the
    storage's ``data_ptr()`` plus byte offsets from the storage offset and strides (metadata only)."""
    es = t.element_size()
    lo = hi = t.storage_offset()
    for n, st in zip(t.shape, t.stride()):
        ext = (n - 1) * st
        if ext < 0:
            lo += ext
        else:
            hi += ext
    base = t.untyped_storage().data_ptr()
    return base + lo * es, base + (hi + 1) * es


def disjoint(name, t, others):
    """``t`` shares no byte with any tensor of ``others`` (name -> tensor or None): their storage
    ranges do not meet (conservative for interleaved views). Metadata only, no host sync; skipped
    for tensors without storage (meta, fake: while compiling)."""
    if t.numel() == 0 or t.device.type == "meta" or torch.compiler.is_compiling():
        return
    lo, hi = byte_range(t)
    for other_name, o in others.items():
        if o is None or o.numel() == 0 or o.device != t.device:
            continue
        olo, ohi = byte_range(o)
        if lo < ohi and olo < hi:
            raise ValueError(f"{name} must not share memory with {other_name}, got byte ranges [{lo:#x}, {hi:#x}) "
                             f"and [{olo:#x}, {ohi:#x}) that overlap")


def first_bad(flags):
    """Host-syncs once on per-rule failure flags (bool tensors, any shape: set anywhere = failed);
    returns the first failing index or None."""
    if not flags:
        return None
    bad = torch.stack([f.any().reshape(()) for f in flags]).cpu().tolist()
    for i, b in enumerate(bad):
        if b:
            return i
    return None


def raise_first(rules):
    """The value-rule engine of the ops: ``rules`` is a list of ``(flag, message)``, ``flag`` a bool
    tensor (any shape; the rule fails where it is set) and ``message()`` the error text, built only
    for the rule that fails (it may read the tensors: that is the error path). One host sync for
    the whole list; raises ValueError with the first failing rule's message."""
    which = first_bad([flag for flag, _ in rules])
    if which is not None:
        raise ValueError(rules[which][1]())


def power_of_two(label, value, detail=""):
    """The page-size rule of every paged layout: ``value`` (an int >= 1) is a power of two, because
    the kernels split row numbers into (page, slot) with shifts and masks. ``label`` names it in the
    error, ``detail`` follows the value there."""
    if value < 1 or value & (value - 1):
        raise ValueError(f"{label} must be a power of two >= 1, got {value}{detail}")
    return value


def first_index(mask):
    """The index tuple of the first set element of a bool tensor (one host sync)."""
    return tuple(mask.nonzero()[0].tolist())


def at(name, t, mask):
    """``"name[i, j] = value"`` for the first set element of ``mask`` (one host sync)."""
    idx = first_index(mask)
    return f"{name}[{', '.join(map(str, idx))}] = {t[idx].item()}"


def range_values(name, t, lo, hi, what=None):
    """Every value of ``t`` lies in ``[lo, hi]`` (one host sync)."""
    if t.numel() == 0:
        return
    bad = (t < lo) | (t > hi)
    raise_first([(bad, lambda: f"{name} must lie in [{lo}, {hi}]{' (' + what + ')' if what else ''}, "
                               f"got {at(name, t, bad)}")])


def not_nan_or_posinf(name, t):
    """No NaN and no +inf in ``t`` (-inf is allowed); one host sync."""
    if t.numel():
        bad = torch.isnan(t) | (t == float("inf"))
        raise_first([(bad, lambda: f"{name} must not contain NaN or +inf, got {at(name, t, bad)}")])


def tree_values(parents, num_nodes, *, parents_name="parents", num_nodes_name="num_nodes"):
    """``parents`` [B, T] describes, per row, a topologically ordered tree of ``num_nodes[b]`` nodes:
    ``parents[b, 0] == -1`` and ``-1 < parents[b, i] < i`` for ``0 < i < num_nodes[b]``.
    Padding entries (``i >= num_nodes[b]``) are ignored. One host sync."""
    B, T = parents.shape
    if B == 0 or T == 0:
        return
    idx = torch.arange(T, device=parents.device)
    nodes_bad = (num_nodes < 1) | (num_nodes > T)
    valid = idx[None, :] < num_nodes[:, None]
    root_bad = valid[:, 0] & (parents[:, 0] != -1)
    child = valid & (idx[None, :] > 0)
    child_bad = child & ((parents < 0) | (parents >= idx[None, :]))

    def root_msg():
        b = int(root_bad.nonzero()[0, 0])
        return f"{parents_name}[{b}, 0] must be -1 (node 0 is the root), got {int(parents[b, 0])}"

    def child_msg():
        b, i = (int(v) for v in child_bad.nonzero()[0])
        return f"{parents_name}[{b}, {i}] must satisfy -1 < parent < {i} (topological order), got {int(parents[b, i])}"

    raise_first([(nodes_bad, lambda: f"{num_nodes_name} must lie in [1, T={T}], got "
                                     f"{at(num_nodes_name, num_nodes, nodes_bad)}"),
                 (root_bad, root_msg), (child_bad, child_msg)])


def tree_nodes(parents, num_nodes, check):
    """``num_nodes`` of a [B, T] ``parents``: checked int32 [B], or all T for None; with ``check``
    also the tree value rules (:func:`tree_values`, one host sync). Returns num_nodes."""
    B, T = parents.shape
    if num_nodes is None:
        num_nodes = torch.full((B,), T, dtype=torch.int32, device=parents.device)
    else:
        lengths("num_nodes", num_nodes, B, parents.device)
    if check:
        tree_values(parents, num_nodes)
    return num_nodes


def lengths(name, t, B, device):
    """An int32 [B] per-sequence length tensor."""
    return tensor(name, t, dtype=torch.int32, shape=(B,), device=device)
