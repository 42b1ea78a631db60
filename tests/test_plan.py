"""Plans (specops.TreeAttentionPlan, specops.KVCompactPlan) against the one-shot ops on every backend and
layout, one plan run over several layers; bad input raises naming the argument (at construction, or at
the first run when the cache's size was not declared) before anything is written; the split schedule."""
import pytest
import torch

import specops
from specops import BackendUnavailable
from specops import backend as _backend

from test_kv_compact import PATTERNS, compaction_case, geometry, i32
from test_tree_attention import PAGED_CASES, PAGED_IDS, make_case, need, paged_case, to_paged


def tree_plan(args, kw, paged=None, **extra):
    """A TreeAttentionPlan for make_case's ``args`` (on the pages of ``paged``); ``extra``: more arguments."""
    q, k, _, prefix, block, mask = args
    opts = dict(prefix_lens=prefix, block_lens=block, mask=mask, q_lens=kw.get("q_lens"), sm_scale=kw.get("sm_scale"),
                head_dim=q.shape[3], num_heads=q.shape[2], num_kv_heads=k.shape[1], dtype=q.dtype)
    if paged is not None:
        opts.update(page_table=paged[2], page_size=paged[0].shape[1])
    return specops.TreeAttentionPlan(**{**opts, **extra})


def one_shot(args, paged, q, k, v, **kw):
    """The one-shot op a plan stands for, on one layer's q, k, v (paged when ``paged`` is given)."""
    if paged is None:
        return specops.tree_attention(q, k, v, *args[3:], **kw)
    return specops.tree_attention_paged(q, k, v, paged[2], *args[3:], **kw)


def layer_copies(t, n, seed):
    """``n`` tensors shaped and strided like ``t`` (other layers of the same cache), fresh values."""
    g = torch.Generator().manual_seed(seed)
    return [t + torch.randn(t.shape, generator=g).to(t.dtype).to(t.device) for _ in range(n)]


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size", PAGED_CASES, ids=PAGED_IDS)
def test_tree_attention_plan_equals_the_op_on_every_layer(backend, device, layout, B, Tq, L, P, Hq, Hkv, D, dtype,
                                                          kind, padded, page_size):
    need("tree_attention_paged" if layout == "paged" else "tree_attention", backend)
    args, kw, paged = paged_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size, seed=P + D, device=device)
    paged = paged if layout == "paged" else None
    plan = tree_plan(args, kw, paged, backend=backend)
    assert plan.backend == backend
    # One plan, three layers: each layer its own q, K and V (same shapes and strides).
    k, v = paged[:2] if paged else args[1:3]
    for ql, kl, vl in zip(layer_copies(args[0], 3, seed=1), layer_copies(k, 3, seed=2), layer_copies(v, 3, seed=3)):
        got = plan.run(ql, kl, vl)
        want = one_shot(args, paged, ql, kl, vl, backend=backend, **kw)
        assert got.dtype == dtype and torch.equal(got, want), "the plan differs from the one-shot op"


def test_tree_attention_plan_default_backend_and_sm_scale(device):
    # No backend named: the plan runs what the one-shot op would pick for the same call.
    args, kw = make_case(2, 4, 9, 20, 6, 3, 32, torch.float32, kind="dag", padded=True, device=device)
    plan = tree_plan(args, {**kw, "sm_scale": 0.3})
    assert plan.kernel is _backend.resolve("tree_attention", args[0].device, None, (*args, kw["q_lens"], 0.3))
    assert torch.equal(plan.run(*args[:3]), specops.tree_attention(*args, sm_scale=0.3, q_lens=kw["q_lens"]))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_kv_compact_plan_equals_the_op(backend, device, pattern, page_size):
    need("kv_compact_paged", backend)
    for B, A, dtype in ((1, 33, torch.float32), (3, 20, torch.bfloat16)):
        cache, kp, vp, table, (prefix, idx, lens) = compaction_case(B, A, pattern, page_size, dtype,
                                                                    seed=A + page_size, device=device)
        # (k, v, the op's page table, the plan's layout): contiguous, paged with and without num_pages
        cases = [(cache, -cache, (), {"max_len": cache.shape[3]})]
        cases += [(kp, vp, (table,), {"page_table": table, "page_size": page_size, "num_pages": n})
                  for n in (kp.shape[1], None)]
        for k, v, paged, declared in cases:
            k, v = k.clone(), v.clone()
            want_k, want_v = k.clone(), v.clone()
            op = specops.kv_compact_paged if paged else specops.kv_compact
            op(want_k, want_v, *paged, prefix, idx, lens, backend=backend)
            plan = specops.KVCompactPlan(prefix, idx, lens, **declared, **geometry(cache, backend=backend))
            assert plan.run(k, v) is None
            assert torch.equal(k, want_k) and torch.equal(v, want_v)


def test_kv_compact_plan_runs_again_on_another_cache(device):
    # A plan is the moves, not the cache: two caches of the same geometry, the same moves.
    cache, _, _, _, (prefix, idx, lens) = compaction_case(3, 12, "random", 4, torch.float32, seed=5, device=device)
    plan = specops.KVCompactPlan(prefix, idx, lens, max_len=cache.shape[3], **geometry(cache))
    for scale in (1.0, 3.0):
        k, v = cache * scale, cache * -scale
        want_k, want_v = k.clone(), v.clone()
        specops.kv_compact(want_k, want_v, prefix, idx, lens)
        plan.run(k, v)
        assert torch.equal(k, want_k) and torch.equal(v, want_v)


# ---- errors: named, raised before anything is written -------------------------------------------

def small_tree(device="cpu"):
    """q [2, 3, 4, 16], caches [2, 2, S = 19, 16], q_lens padded."""
    return make_case(2, 3, 6, 10, 4, 2, 16, torch.float32, kind="tree", padded=True, device=device)


@pytest.mark.parametrize("change, exc, match", [
    ({"head_dim": "16"}, TypeError, "head_dim must be an int"),
    ({"num_kv_heads": 3}, ValueError, r"num_kv_heads heads must divide q heads .*Hq=4, Hkv=3"),
    ({"dtype": torch.float64}, TypeError, "dtype must be one of"),
    ({"sm_scale": float("nan")}, TypeError, "sm_scale must be a finite real number"),
    ({"page_size": 16}, ValueError, "page_size is for the paged layout"),
    ({"max_len": 5}, ValueError, r"prefix_lens \+ block_lens must be <= S = 5"),
    ({"backend": "nope"}, ValueError, "backend= must name one of"),
    # the block metadata (a callable: from the case's args)
    ({"mask": lambda a: a[5][:1]}, ValueError, r"mask must have shape \[B=2, Tq=3, W\]"),
    ({"block_lens": lambda a: a[4].long()}, TypeError, "block_lens must have dtype torch.int32"),
    ({"page_table": i32([[0, 1]]), "page_size": 4}, ValueError, r"page_table must have shape \[2, \*\]"),
    ({"page_table": i32([[0], [1]]), "page_size": 6}, ValueError, "page_size must be a power of two"),
    ({"block_lens": i32([6, -1]), "max_len": 64}, ValueError, "block_lens must be >= 0"),  # [0]: L = 6
    ({"num_splits": 65}, ValueError, r"num_splits must be <= 64"),
    ({"num_splits": 2.0}, TypeError, r"num_splits must be an int"),
    ({"invariant": True, "num_splits": 2}, ValueError, "num_splits must be None or 1 with invariant=True"),
])
def test_tree_attention_plan_rejects_bad_arguments_at_construction(change, exc, match):
    args, kw = small_tree()
    with pytest.raises(exc, match=match):
        tree_plan(args, kw, **{name: v(args) if callable(v) else v for name, v in change.items()})


def test_tree_attention_plan_checks_the_first_run_and_the_undeclared_cache_size():
    args, kw = small_tree()
    q, k, v = args[:3]
    plan = tree_plan(args, kw)  # q's dtype and shape against the declared: tests/test_bad_input_plans.py
    with pytest.raises(ValueError, match=r"prefix_lens \+ block_lens must be <= S = 4"):
        plan.run(q, k[:, :, :4], v[:, :, :4])  # the value rules run here: max_len was not declared
    out = plan.run(q, k, v)  # a good first run after a rejected one
    torch.testing.assert_close(out, specops.tree_attention(*args, **kw))
    # paged: a page id outside the pool, found at the first run (num_pages undeclared)
    _, kp, vp, table = to_paged(args, 4, seed=0)[:4]
    table[0, 0] = kp.shape[0] + 3
    plan = tree_plan(args, kw, (kp, vp, table))
    with pytest.raises(ValueError, match=r"page_table\[0, 0\] must lie in \[0, num_pages="):
        plan.run(q, kp, vp)
    with pytest.raises(ValueError, match=r"page_table\[0, 0\] must lie in"):
        tree_plan(args, kw, (kp, vp, table), num_pages=kp.shape[0])


def test_explicit_backend_that_cannot_run_raises_at_construction():
    args, kw = small_tree()
    for name in _backend.BACKENDS:
        if not _backend.available(name, "cpu")[0] and name in _backend.implementations("tree_attention"):
            with pytest.raises(BackendUnavailable, match=name):
                tree_plan(args, kw, backend=name)
            return
    pytest.skip("every tree_attention backend is available here")


def test_kv_compact_plan_errors_leave_the_caches_untouched():
    cache, kp, vp, table, (prefix, idx, lens) = compaction_case(2, 10, "random", 4, torch.float32, seed=3)
    S = cache.shape[3]
    k, v = cache.clone(), -cache
    before = [t.clone() for t in (k, v, kp, vp)]
    geo = geometry(cache)
    bad_idx = i32([[0, 2, 1] + [0] * 7, [0, 1, 2] + [0] * 7])
    with pytest.raises(ValueError, match=r"accept_idx\[0, :accept_lens\[0\]\] must be strictly increasing"):
        specops.KVCompactPlan(prefix, bad_idx, i32([3, 3]), max_len=S, **geo)
    with pytest.raises(TypeError, match="lens must have dtype torch.int32"):
        specops.KVCompactPlan(prefix.long(), idx, lens, max_len=S, **geo)
    with pytest.raises(TypeError, match="needs max_len"):
        specops.KVCompactPlan(prefix, idx, lens, **geo)
    with pytest.raises(TypeError, match="num_layers must be an int"):
        specops.KVCompactPlan(prefix, idx, lens, max_len=S, **{**geo, "num_layers": 2.0})
    plan = specops.KVCompactPlan(prefix, idx, lens, max_len=S, **geo)
    with pytest.raises(ValueError, match=r"k_cache must be a torch.float32 tensor of shape \[2, 2, 2, 15, 8\]"):
        plan.run(k[:1], v[:1])
    with pytest.raises(TypeError, match="k_cache must have dtype"):
        plan.run(k.double(), v.double())
    with pytest.raises(ValueError, match="v_cache must not share memory with k_cache"):
        plan.run(k, k)
    # paged: a written page shared by both sequences, found at the first run (num_pages undeclared)
    shared = table.clone()
    shared[1] = shared[0]
    moves = (i32([3, 5]), i32([[1, 2] + [3] * 8] * 2), i32([2, 2]))  # rows p+1, p+2 -> p, p+1
    plan = specops.KVCompactPlan(*moves, page_table=shared, page_size=4, **geo)
    with pytest.raises(ValueError, match=r"page_table\[\d, \d+\] = \d+ holds rows the compaction writes"):
        plan.run(kp, vp)
    assert all(torch.equal(a, b) for a, b in zip(before, (k, v, kp, vp)))


# ---- the schedule: split count and partials workspace, chosen once per plan ---------------------

@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 7])
def test_the_plan_schedules_once_and_every_layer_reuses_it(backend, device, layout, num_splits):
    # Decode over a long prefix: the CPU and GPU rules both split; a forced count (7: empty splits for
    # sequences with fewer tiles) gives the reference too.
    need("tree_attention_paged" if layout == "paged" else "tree_attention", backend)
    args, kw, paged = paged_case(2, 2, 3, 700, 8, 2, 64, torch.float32, "chain", True, 16, seed=3, device=device)
    paged = paged if layout == "paged" else None
    plan = tree_plan(args, kw, paged, backend=backend, num_splits=num_splits)
    data = paged[:2] if paged else args[1:3]
    plan.run(args[0], *data)
    ns, ws = plan.num_splits, plan.workspace
    assert ns >= 1 and (num_splits is None or ns == num_splits)
    B, Tq, Hq, D = args[0].shape
    assert ws is None if ns == 1 else (ws.dtype == torch.float32 and ws.numel() == ns * B * Tq * Hq * (D + 1))
    for q in layer_copies(args[0], 3, 9):
        got = plan.run(q, *data)
        assert plan.num_splits == ns and plan.workspace is ws  # chosen once, reused by every layer
        want = one_shot(args, paged, q, *data, backend="torch", **kw)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_the_split_rules_split_a_long_decode_and_not_a_full_batch():
    from specops.ops.tree_attention import splits

    # CPU: 8 items over 2 threads already divide evenly; 3 items over 2 threads split the keys.
    assert splits.cpu_splits(B=1, Tq=1, Hq=32, Hkv=8, D=128, max_tiles=43, threads=2) == 1
    assert splits.cpu_splits(B=1, Tq=1, Hq=3, Hkv=3, D=128, max_tiles=43, threads=2) > 1
    assert splits.cpu_splits(B=1, Tq=1, Hq=3, Hkv=3, D=128, max_tiles=43, threads=1) == 1
    # GPU: 8 programs on 132 SMs split; 64 sequences fill the device.
    assert splits.gpu_launch_splits(1, 1, 32, 8, 128, 4096, 2, False, 64, 32, 90, 132) > 1
    assert splits.gpu_launch_splits(64, 1, 32, 8, 128, 4096, 2, False, 64, 32, 90, 132) == 1
