"""Argument validation shared by every op: errors name the argument, the expectation and what came (the
value; for tensors the first offending element's position). Metadata checks never touch values; value
checks are rules an op hands to ``raise_first`` (one host sync, only when the op's ``check=True``)."""
import numbers

import torch


def tensor(name, t, *, dtype=None, rank=None, shape=None, device=None, last_stride_one=False):
    """One tensor argument; ``dtype``: a dtype or a tuple of them; ``shape``: a tuple, ``None`` entries free."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if rank is None and shape is not None:
        rank = len(shape)
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
    if shape is not None:
        for got, want in zip(t.shape, shape):
            if want is not None and got != want:
                expect = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
                raise ValueError(f"{name} must have shape {expect}, got {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {device} (with the other inputs), got {t.device}")
    if last_stride_one and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {t.stride()}")
    return t


def scalar(name, value, types, want, width=None):
    """A Python scalar of ``types`` (bool rejected), returned; else TypeError ``"{name} must be {want},
    got {type} {repr}"`` (the repr cut to ``width`` characters where given)."""
    if isinstance(value, bool) or not isinstance(value, types):
        got = format(repr(value), f".{width}" if width else "")
        raise TypeError(f"{name} must be {want}, got {type(value).__name__} {got}")
    return value


def nonempty(name, t, dim, what):
    """The size of ``t``'s dim ``dim``, which must be >= 1 (``what``: one entry, e.g. ``"node (T >= 1)"``)."""
    if t.shape[dim] == 0:
        raise ValueError(f"{name} must have at least one {what}, got shape {tuple(t.shape)}")
    return t.shape[dim]


def integer(name, value, lo=None, hi=None, why=""):
    """A Python int (bool rejected) in ``[lo, hi]`` (``None``: unbounded; ``why`` explains ``hi``), returned."""
    value = int(scalar(name, value, numbers.Integral, "an int"))
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}{' (' + why + ')' if why else ''}, got {value}")
    return value


def byte_range(t):
    """The addresses of a non-empty tensor's first byte and one past its last (metadata only)."""
    extents = [(n - 1) * st for n, st in zip(t.shape, t.stride())]
    lo = t.storage_offset() + sum(e for e in extents if e < 0)
    hi = t.storage_offset() + sum(e for e in extents if e > 0)
    base, es = t.untyped_storage().data_ptr(), t.element_size()
    return base + lo * es, base + (hi + 1) * es


def disjoint(name, t, others):
    """``t`` shares no byte with any tensor of ``others`` (name -> tensor or None): storage ranges do not
    meet (conservative for interleaved views). Metadata only; skipped without storage (meta, fake)."""
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


def declared(name, label, got, what, value, by="plan"):
    """A size the ``by`` (a plan, a layout) was declared with (``what`` = ``value``; None: not declared)
    against its tensor's (``label`` = ``got`` of ``name``): equal, or ValueError naming both."""
    if value is not None and got != value:
        raise ValueError(f"{name} has {label}={got}, but the {by} was declared with {what}={value} "
                         "(the sizes must match)")


def same_shapes(names, got, want):
    """A plan's later run against its first run's shapes: ValueError naming the first that differs."""
    for name, g, w in zip(names, got, want):
        if g != w:
            raise ValueError(f"{name} must have the shape of the plan's first run {tuple(w)}, got {tuple(g)} "
                             "(build a new plan when the cache changes shape)")


# ---- value rules: ``(bad, message)``, ``bad`` a bool tensor (any shape) set where the rule fails and
# ``message()`` the error text, built only for the rule that fails (the error path: it may read values).

def raise_first(rules):
    """One host sync for the whole list of rules; ValueError with the first failing rule's message."""
    if not rules:
        return
    bad = torch.stack([flag.any().reshape(()) for flag, _ in rules]).cpu().tolist()
    for failed, (_, message) in zip(bad, rules):
        if failed:
            raise ValueError(message())


def rule(name, t, bad, expect, got=None):
    """Every value of ``t`` satisfies ``expect``; fails where ``bad`` is set: ``"{name} must {expect}, got
    {got(name, t, bad)}"`` (``got``: :func:`at` unless given, e.g. :func:`value_at`)."""
    return bad, lambda: f"{name} must {expect}, got {(got or at)(name, t, bad)}"


def row_rule(name, bad, expect, got):
    """A rule over rows (``bad`` indexed by row): ``"{name}[i, j] must {expect}, got {got}"`` for the first
    failing row (``got``: a string, or a function of the row's index tuple)."""
    def message():
        idx = first_index(bad)
        return f"{name}[{', '.join(map(str, idx))}] must {expect}, got {got(idx) if callable(got) else got}"
    return bad, message


def power_of_two(label, value, detail=""):
    """A paged layout's page size: ``value`` >= 1 is a power of two (the kernels split rows into (page,
    slot) with shifts and masks); ``label`` names it, ``detail`` follows the value."""
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


def value_at(name, t, mask):
    """``"value at [i, j]"`` for the first set element of ``mask`` (one host sync)."""
    idx = first_index(mask)
    return f"{t[idx].item()} at [{', '.join(map(str, idx))}]"


def range_values(name, t, lo, hi, what=None):
    """Every value of ``t`` lies in ``[lo, hi]`` (one host sync)."""
    if t.numel():
        raise_first([rule(name, t, (t < lo) | (t > hi), f"lie in [{lo}, {hi}]{' (' + what + ')' if what else ''}")])


def not_nan_or_posinf(name, t):
    """No NaN and no +inf in ``t`` (-inf is allowed); one host sync."""
    if t.numel():
        raise_first([rule(name, t, torch.isnan(t) | (t == float("inf")), "not contain NaN or +inf")])


def uniform_rule(name, u):
    """The rule of a tensor of uniforms: every value in [0, 1) (NaN fails)."""
    return rule(name, u, ~((u >= 0) & (u < 1)), "lie in [0, 1) (NaN counts as outside)")


def prob_rules(name, rows, where, tol):
    """Probability rows [..., V]: finite, >= 0, summing to 1 (within ``tol``) where ``where`` (bool [...])."""
    bad_entry = ~torch.isfinite(rows) | (rows < 0)
    nonfinite = where & bad_entry.any(-1)
    sums = rows.sum(-1, dtype=torch.float64)
    off = where & ~nonfinite & ((sums - 1).abs() > tol)
    return [row_rule(name, nonfinite, "be finite and non-negative",
                     lambda _: at(name, rows, nonfinite[..., None] & bad_entry)),
            row_rule(name, off, f"sum to 1 (within {tol})", lambda idx: f"{float(sums[idx]):.6g}")]


def logit_rules(name, logits, where, allowed=None):
    """Logit rows [..., V]: no NaN / +inf, and at least one value above -inf, at the positions
    ``where`` (bool [...]), among the ``allowed`` entries (bool [..., V]) where given."""
    bad_entry = torch.isnan(logits) | (logits == torch.inf)
    finite = logits != -torch.inf
    if allowed is not None:
        bad_entry &= allowed
        finite &= allowed
    bad = where[..., None] & bad_entry
    empty = where & ~bad.any(-1) & ~finite.any(-1)
    return [rule(name, logits, bad, "not contain NaN or +inf"),
            row_rule(name, empty, "have at least one finite value", "all -inf")]


def tree_rules(parents, num_nodes, tokens=None, V=None):
    """The rules of a batch of trees (T >= 1): ``num_nodes`` in [1, T], ``parents[b, 0] == -1`` and
    ``-1 < parents[b, i] < i`` for ``0 < i < num_nodes[b]`` (padding ignored); with ``tokens`` also
    ``0 <= tokens[b, i] < V`` at those nodes."""
    T = parents.shape[1]
    idx = torch.arange(T, device=parents.device)
    valid = valid_mask(num_nodes, T)
    root_bad = valid[:, 0] & (parents[:, 0] != -1)
    child = valid & (idx[None, :] > 0)
    child_bad = child & ((parents < 0) | (parents >= idx[None, :]))

    def root():
        b = first_index(root_bad)[0]
        return f"parents[{b}, 0] must be -1 (node 0 is the root), got {int(parents[b, 0])}"

    def parent():
        b, i = first_index(child_bad)
        return f"parents[{b}, {i}] must satisfy -1 < parent < {i} (topological order), got {int(parents[b, i])}"

    rules = [rule("num_nodes", num_nodes, (num_nodes < 1) | (num_nodes > T), f"lie in [1, T={T}]"),
             (root_bad, root), (child_bad, parent)]
    if tokens is not None:
        rules.append(row_rule("tokens", child & ((tokens < 0) | (tokens >= V)), f"lie in [0, V={V})",
                              lambda i: int(tokens[i])))
    return rules


def valid_mask(num_nodes, T):
    """bool [B, T]: which of T positions are among the first ``num_nodes[b]`` (the rest is padding)."""
    return torch.arange(T, device=num_nodes.device)[None, :] < num_nodes[:, None]


def node_counts(num_nodes, B, T, device):
    """``num_nodes`` checked int32 [B], or all T for None."""
    if num_nodes is None:
        return torch.full((B,), T, dtype=torch.int32, device=device)
    return lengths("num_nodes", num_nodes, B, device)


def tree_nodes(parents, num_nodes, check):
    """Returns :func:`node_counts` of [B, T] ``parents``; with ``check`` also :func:`tree_rules` (a sync)."""
    num_nodes = node_counts(num_nodes, *parents.shape, parents.device)
    if check and parents.numel():
        raise_first(tree_rules(parents, num_nodes))
    return num_nodes


def lengths(name, t, B, device):
    """An int32 [B] per-sequence length tensor."""
    return tensor(name, t, dtype=torch.int32, shape=(B,), device=device)
