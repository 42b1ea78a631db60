"""Bad input to the plans, the split workspace, sm_scale and the raw ops (issue #34), on every backend: a
plan reconciles its declared sizes with its tensors (first run: both sizes in the error; later runs: the
first run's shapes); a workspace aliasing an input and scales that would overflow the scores are refused
(the largest allowed one stays exact); the compiled ops raise ValueError/TypeError as the entry points do.
Every case asserts the exception type, the argument's name (or both sizes) and that no input changed."""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.ops.tree_attention import SM_SCALE_MAX

from _op_checks import raises, raw
from test_kv_compact import compaction_case, geometry, i32
from test_plan import small_tree as _case
from test_plan import tree_plan
from test_tree_attention import need, to_paged

LAYOUTS = ("contiguous", "paged")


def _layout_case(layout, backend, device, **plan_kw):
    """The case's q, k, v in ``layout`` (paged: the same rows in scattered pages), its plan, the
    cache argument's name and the paged tensors (None contiguous)."""
    need("tree_attention" if layout == "contiguous" else "tree_attention_paged", backend)
    args, kw = _case(device)
    q, k, v = args[:3]
    paged = to_paged(args, 4, seed=0)[1:4] if layout == "paged" else None  # k_pages, v_pages, page_table
    if paged is not None:
        k, v = paged[:2]
    plan = tree_plan(args, kw, paged, backend=backend, **plan_kw)
    return args, kw, (q, k, v), plan, "k_pages" if paged else "k_cache", paged


# ---- TreeAttentionPlan: declared sizes against the tensors -----------------------------------------

# (layout, declared, what the run's q / k / v become, exception, message parts; {pool}: the pool's pages)
@pytest.mark.parametrize("layout, declared, change, exc, parts", [
    ("contiguous", {"max_len": 64}, None, ValueError, ("k_cache has S=19", "max_len=64")),
    ("paged", {"num_pages": 100}, None, ValueError, ("num_pages", "num_pages={pool}", "num_pages=100")),
    ("contiguous", {"num_kv_heads": 1}, None, ValueError, ("k_cache has Hkv=2", "num_kv_heads=1")),
    ("contiguous", {"head_dim": 8, "num_heads": 4}, None, ValueError,
     ("q must have shape [2, 3, 4, 8]", "(2, 3, 4, 16)")),
    ("contiguous", {"num_heads": 2, "num_kv_heads": 2}, None, ValueError,
     ("q must have shape [2, 3, 2, 16]", "(2, 3, 4, 16)")),
    ("contiguous", {}, torch.Tensor.half, TypeError, ("q must have dtype torch.float32", "torch.float16")),
    ("contiguous", {}, lambda t: t.to("meta"), ValueError, ("q must be on",)),
], ids=["max_len", "num_pages", "heads", "head_dim", "num_heads", "dtype", "device"])
def test_tree_plan_declared_sizes_must_match(backend, device, layout, declared, change, exc, parts):
    _, _, qkv, plan, _, paged = _layout_case(layout, backend, device, **declared)
    run = [change(t) for t in qkv] if change else qkv
    raises(exc, [p.format(pool=qkv[1].shape[0]) for p in parts], lambda: plan.run(*run), *qkv,
           *(paged[2:] if paged else ()))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tree_plan_later_runs_must_pass_the_first_runs_shapes(backend, device, layout):
    _, _, (q, k, v), plan, name, paged = _layout_case(layout, backend, device)
    # a smaller pool, or a smaller cache (still holds every row used)
    small_k, small_v = (k[:-2], v[:-2]) if paged else (k[:, :, :-3], v[:, :, :-3])
    first = plan.run(q, k, v)
    raises(ValueError, (name, str(tuple(k.shape)), str(tuple(small_k.shape)), "new plan"),
           lambda: plan.run(q, small_k, small_v), small_k, small_v)
    torch.testing.assert_close(plan.run(q, k, v), first, rtol=0, atol=0)  # still good on the right shapes


# ---- the split workspace -----------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_workspace_aliasing_the_cache_is_refused(backend, device, layout):
    args, kw, (q, k, v), plan, name, paged = _layout_case(layout, backend, device, num_splits=2)
    want = plan.run(q, k, v)
    n = plan.workspace.numel()
    plan.workspace = raw(k).view(torch.float32)  # the case: partials over the cache
    raises(ValueError, ("workspace must not share memory with " + name,), lambda: plan.run(q, k, v), q, k, v)
    fresh = tree_plan(args, kw, paged, backend=backend, num_splits=2, workspace=raw(v).view(torch.float32))
    raises(ValueError, ("workspace must not share memory with",), lambda: fresh.run(q, k, v), q, k, v)
    with pytest.raises(ValueError, match="workspace must not share memory with mask"):
        tree_plan(args, kw, paged, backend=backend, num_splits=2, workspace=args[5].view(torch.float32))
    with pytest.raises(ValueError, match=r"workspace must have >= .* elements"):
        tree_plan(args, kw, paged, backend=backend, num_splits=2, workspace=torch.empty(3, device=device))
    # a disjoint workspace passed in is used, and gives the plan's own result
    own = torch.full((n,), float("nan"), device=device)
    good = tree_plan(args, kw, paged, backend=backend, num_splits=2, workspace=own)
    torch.testing.assert_close(good.run(q, k, v), want)
    assert good.workspace is own


def _raw_ops(backend):
    if backend not in _backend.COMPILED or not _backend.available(backend, "cpu")[0]:
        pytest.skip(f"{backend} has no torch.ops entry point")
    return getattr(torch.ops, _backend.COMPILED[backend])


def test_the_raw_op_refuses_a_workspace_aliasing_an_input(backend, device):
    ops = _raw_ops(backend)
    args, kw = _case(device)
    q, k, v, prefix, block, mask = args
    ql = kw["q_lens"]
    big = torch.zeros(4096, device=device)  # q inside a buffer large enough to be a workspace
    qb = big[:q.numel()].view_as(q).copy_(q)
    k32, v32 = (raw(t).view(torch.float32) for t in (k, v))  # buffers over the caches' storages
    for ws, qq, name in ((k32, q, "k_cache"), (v32, q, "v_cache"), (big, qb, "q")):
        assert ws.numel() >= 2 * q.numel() // 16 * 17
        raises(ValueError, (f"workspace must not share memory with {name}",),
               lambda: ops.tree_attention(qq, k, v, prefix, block, mask, ql, 0.25, 2, ws), qq, k, v)
    kp, vp, table = to_paged(args, 4, seed=0)[1:4]
    raises(ValueError, ("workspace must not share memory with k_pages",),
           lambda: ops.tree_attention_paged(q, kp, vp, table, prefix, block, mask, ql, 0.25, 2,
                                            raw(kp).view(torch.float32)),
           kp, vp)


# ---- sm_scale --------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e38, -1e38, SM_SCALE_MAX * 2])
def test_a_scale_that_overflows_the_scores_is_refused(backend, device, scale):
    need("tree_attention", backend)
    args, kw = _case(device)
    kw = {**kw, "sm_scale": scale}
    raises(ValueError, ("sm_scale", repr(scale)), lambda: specops.tree_attention(*args, **kw, backend=backend),
           *args[:3])
    with pytest.raises(ValueError, match="sm_scale"):
        tree_plan(args, kw, backend=backend)


@pytest.mark.parametrize("scale", [SM_SCALE_MAX, -SM_SCALE_MAX])
def test_the_largest_scale_is_exact_on_every_backend(backend, device, scale):
    # scores up to ~1e7: the softmax is one-hot in fp32 and every backend must find the same key
    need("tree_attention", backend)
    args, kw = _case(device)
    kw = {**kw, "sm_scale": scale}
    want = specops.tree_attention(*args, **kw, backend="torch")
    assert torch.isfinite(want).all()
    torch.testing.assert_close(specops.tree_attention(*args, **kw, backend=backend), want, rtol=1e-5, atol=1e-5)


def test_the_raw_op_checks_sm_scale(backend, device):
    ops = _raw_ops(backend)
    args, kw = _case(device)
    for bad in (1e38, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="sm_scale"):
            ops.tree_attention(*args, kw["q_lens"], bad, 1, None)


# ---- raw ops: argument errors are ValueError / TypeError ---------------------------------------------

def test_raw_op_argument_errors_are_value_and_type_errors(backend, device):
    ops = _raw_ops(backend)
    args, kw = _case(device)
    q, k, v, prefix, block, mask = args

    def call(k, v, prefix, num_splits=1):
        return lambda: ops.tree_attention(q, k, v, prefix, block, mask, kw["q_lens"], 0.25, num_splits, None)
    raises(ValueError, ("rank",), call(k[0], v[0], prefix), q, k, v)
    raises(TypeError, ("prefix_lens",), call(k, v, prefix.long()), q, k, v)
    raises(ValueError, ("num_splits",), call(k, v, prefix, num_splits=0), q, k, v)
    cache, kp, vp, table, (lens, idx, acc) = compaction_case(2, 6, "random", 4, torch.float32, seed=1, device=device)
    kc, vc = cache.clone(), -cache
    raises(ValueError, ("rank",), lambda: ops.kv_compact(kc[0], vc[0], lens, idx, acc), kc, vc)
    raises(TypeError, ("prefix_lens must be",), lambda: ops.kv_compact(kc, vc, lens.long(), idx, acc), kc, vc)
    raises(ValueError, ("v_cache must match k_cache",), lambda: ops.kv_compact(kc, vc.half(), lens, idx, acc),
           kc, vc)
    raises(ValueError, ("page_size",), lambda: ops.kv_compact_paged(kp[:, :, :3], vp[:, :, :3], table, lens, idx, acc),
           kp, vp)


# ---- KVCompactPlan -------------------------------------------------------------------------------------

def test_kv_compact_plan_declared_num_pages_must_match_the_pool(backend, device):
    need("kv_compact_paged", backend)
    cache, kp, vp, table, (lens, idx, acc) = compaction_case(2, 6, "random", 4, torch.float32, seed=2, device=device)
    plan = specops.KVCompactPlan(lens, idx, acc, page_table=table, page_size=4, num_pages=kp.shape[1] + 50,
                                 **geometry(cache, backend=backend))
    raises(ValueError, ("k_pages", f"num_pages={kp.shape[1]}", f"num_pages={kp.shape[1] + 50}"),
           lambda: plan.run(kp, vp), kp, vp)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kv_compact_plan_later_runs_must_pass_the_first_runs_shapes(backend, device, layout):
    need("kv_compact" if layout == "contiguous" else "kv_compact_paged", backend)
    cache, kp, vp, table, (lens, idx, acc) = compaction_case(2, 6, "random", 4, torch.float32, seed=4, device=device)
    L, B, H, S, D = cache.shape
    geo = geometry(cache, backend=backend)
    if layout == "paged":
        plan = specops.KVCompactPlan(lens, idx, acc, page_table=table, page_size=4, **geo)
        k, v, name = kp, vp, "k_pages"
    else:
        plan = specops.KVCompactPlan(lens, idx, acc, max_len=S, **geo)
        k, v, name = cache.clone(), -cache, "k_cache"
    plan.run(k, v)
    small_k, small_v = k[:1].clone(), v[:1].clone()  # one layer fewer
    raises(ValueError, (name, str(tuple(k.shape)), str(tuple(small_k.shape))), lambda: plan.run(small_k, small_v),
           small_k, small_v)
    wide = torch.zeros(L, B, H, S, 2 * D, device=device)[..., :D] if layout == "contiguous" else None
    if wide is not None:  # same shape, other strides: accepted (views of one cache are the point)
        plan.run(wide, wide.clone())


def test_kv_compact_plan_error_names_the_lens_argument(device):
    cache, _, _, _, (lens, idx, acc) = compaction_case(2, 6, "random", 4, torch.float32, seed=5, device=device)
    with pytest.raises(ValueError, match=r"accept_lens must have shape \[2\]"):
        specops.KVCompactPlan(lens, idx, acc[:1], max_len=cache.shape[3], **geometry(cache))
    with pytest.raises(ValueError, match="num_pages must be >= 1"):
        specops.KVCompactPlan(lens, idx, acc, page_table=i32([[0, 1], [2, 3]]), page_size=4, num_pages=0,
                              **geometry(cache))
