"""topn_expand and select_topn_subtree: golden cases, every backend vs the reference, torch.topk
equivalence, subtree properties (hypothesis), errors, registration."""
import math

import pytest
import torch
from _op_checks import assert_same, needs_cpp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specops
from specops import backend as _backend
from specops.testing import random_num_nodes, random_parents

INF = float("inf")


def expand(parent_scores, child_logprobs, n, k=None, backend="torch", device="cpu"):
    ps, cl = (torch.as_tensor(v, dtype=torch.float32, device=device) for v in (parent_scores, child_logprobs))
    if ps.dim() == 1:  # one row
        ps, cl = ps[None], cl[None]
    return tuple(t.cpu() for t in specops.topn_expand(ps, cl, n, per_parent_k=k, backend=backend))


def log(*p):
    return [math.log(v) if v > 0 else -INF for v in p]


# ---- topn_expand: golden cases on every backend ------------------------------------------------

# name: (parent_scores [P], child_logprobs [P, V], n, per_parent_k, want parents, tokens, scores or None)
EXPAND_GOLDEN = {
    "single-parent-top-n-ties-to-the-lower-token": ([0.0], [log(0.1, 0.5, 0.2, 0.2)], 3, None, [0, 0, 0], [1, 2, 3],
                                                    log(0.5, 0.2, 0.2)),
    "scores-add-parent-and-child-across-parents": ([-1.0, -0.5], [[-0.1, -2.0, -0.3], [-0.7, -0.2, -5.0]], 4, None,
                                                   [1, 0, 1, 0], [1, 0, 0, 2], [-0.7, -1.1, -1.2, -1.3]),
    "equal-scores-go-to-the-lower-parent-then-token": ([0.0, 0.0], [log(0.25, 0.5, 0.25)] * 2, 6, None,
                                                       [0, 1, 0, 0, 1, 1], [1, 1, 0, 2, 0, 2], None),
    "per_parent_k-caps-each-parents-share": ([0.0, -1.0], [log(0.4, 0.3, 0.2, 0.1), log(0.1, 0.1, 0.7, 0.1)], 4, 2,
                                             [0, 0, 1, 1], [0, 1, 2, 0], None),
    "padding-parents-never-selected-missing-slots-padded": (
        [-INF, 0.0, -INF], [log(0.5, 0.5), log(0.9, 0.1), log(0.5, 0.5)], 5, None, [1, 1, -1, -1, -1],
        [0, 1, -1, -1, -1], log(0.9, 0.1, 0, 0, 0)),
    "minus-inf-children-are-unavailable": ([0.0], [[-INF, -1.0, -INF, -2.0]], 3, None, [0, 0, -1], [1, 3, -1],
                                           [-1.0, -2.0, -INF]),
}


@pytest.mark.parametrize("ps, cl, n, k, parents, tokens, scores", EXPAND_GOLDEN.values(), ids=EXPAND_GOLDEN)
def test_expand_golden(backend, device, ps, cl, n, k, parents, tokens, scores):
    s, t, p = expand(ps, cl, n, k, backend=backend, device=device)
    assert p.tolist() == [parents] and t.tolist() == [tokens]
    if scores is not None:
        torch.testing.assert_close(s, torch.tensor([scores]))


def test_tsd_style_top_k_per_frontier_node(backend, device):
    cl = torch.log_softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(1)), -1)
    _, t, p = expand([0.0, -2.0, -9.0], cl, 12, k=4, backend=backend, device=device)
    assert sorted(p[0].tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    for parent in range(3):
        want = cl[parent].topk(4).indices.tolist()
        assert sorted(t[0][p[0] == parent].tolist()) == sorted(want)


# ---- topn_expand: every backend vs the reference --------------------------------------------------

def _expand_case(B, P, V, dtype, ties, seed):
    g = torch.Generator().manual_seed(seed)
    ps = torch.randn(B, P, generator=g) * 2
    cl = torch.log_softmax(torch.randn(B, P, V, generator=g) * 2, dim=-1)
    if ties:  # exact ties within and across parents; some padding parents
        ps, cl = ps.round(), (cl * 2).round() / 2
        ps[:, 1::3] = -INF
    return ps, cl.to(dtype)


EXPAND_GRID = [(B, P, V) for B in (1, 3, 33) for P, V in ((1, 11), (5, 11), (5, 1000))] + [
    (1, 1, 32000), (3, 5, 32000), (33, 2, 32000)]
INTERPRETED = {(1, 1, 11), (3, 5, 11), (1, 1, 1000)}
NK = [(1, None), (7, None), (7, 1), (60, 4), (60, None)]


@pytest.mark.parametrize("B,P,V", EXPAND_GRID)
def test_expand_matches_reference(fast_backend, device, B, P, V):
    interpreted = fast_backend == "triton" and device == "cpu"
    if interpreted and (B, P, V) not in INTERPRETED:
        pytest.skip("the Triton interpreter is slow: a smaller grid covers it")
    for ties in (False, True):
        ps, cl = _expand_case(B, P, V, torch.float32, ties, B * P * V)
        for n, k in (NK[1:4] if interpreted else NK):
            want = specops.topn_expand(ps, cl, n, per_parent_k=k, backend="torch")
            got = specops.topn_expand(ps.to(device), cl.to(device), n, per_parent_k=k, backend=fast_backend)
            assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_expand_half_inputs_match_reference(fast_backend, device, dtype):
    ps, cl = _expand_case(3, 5, 300 if fast_backend == "triton" else 32000, dtype, True, 7)
    want = specops.topn_expand(ps, cl, 9, per_parent_k=3, backend="torch")
    assert_same(specops.topn_expand(ps.to(device), cl.to(device), 9, per_parent_k=3, backend=fast_backend), want)


def test_expand_equals_torch_topk_without_ties(backend, device):
    """A beam step (n = beams) or any n without per_parent_k: the flat topk of parent + child."""
    ps, cl = _expand_case(3, 5, 700, torch.float32, False, 3)
    top = (ps[:, :, None] + cl).reshape(3, -1).topk(20)
    s, t, p = expand(ps, cl, 20, backend=backend, device=device)
    torch.testing.assert_close(s, top.values, rtol=0, atol=0)
    assert torch.equal(p.long() * 700 + t, top.indices)
    # per_parent_k: the per-parent topk, then the global topk
    per = cl.topk(2, dim=-1)
    best = (ps[:, :, None] + per.values).reshape(3, -1).topk(6)
    _, t, p = expand(ps, cl, 6, 2, backend=backend, device=device)
    assert torch.equal(p.long(), best.indices // 2)
    assert torch.equal(t.long(), per.indices.reshape(3, -1).gather(1, best.indices))


# ---- select_topn_subtree: golden cases on every backend ----------------------------------------

def select(parents, scores, n, num_nodes=None, backend="torch", device="cpu"):
    par, sc = torch.atleast_2d(torch.tensor(parents, dtype=torch.int32, device=device),
                               torch.tensor(scores, dtype=torch.float32, device=device))
    nn = None if num_nodes is None else torch.tensor(num_nodes, dtype=torch.int32, device=device)
    return tuple(t.cpu() for t in specops.select_topn_subtree(par, sc, n, nn, backend=backend))


# name: (parents, scores, n, num_nodes, want keep, new parents, counts); one row unless nested
SELECT_GOLDEN = {
    "chain-keeps-its-first-n-nodes": ([-1, 0, 1, 2, 3], [0.0, -0.1, -0.5, -0.6, -2.0], 3, None, [[0, 1, 2]],
                                      [[-1, 0, 1]], [3]),
    # 0 -> 1 (-0.2), 2 (-1.0); 1 -> 3 (-0.5), 4 (-3.0); 2 -> 5 (-1.1)
    "best-nodes-kept-in-original-order-and-reindexed": ([-1, 0, 0, 1, 1, 2], [0.0, -0.2, -1.0, -0.5, -3.0, -1.1], 4,
                                                        None, [[0, 1, 2, 3]], [[-1, 0, 0, 1]], [4]),
    "ties-go-to-the-lower-index": ([-1, 0, 0, 0, 1], [0.0, -1.0, -1.0, -1.0, -1.0], 3, None, [[0, 1, 2]], [[-1, 0, 0]],
                                   [3]),
    # node 3's own score beats node 1, but its parent 2 is weak: both or neither.
    "a-child-above-its-parent-still-connected": ([-1, 0, 0, 2], [0.0, -0.5, -2.0, -0.1], 3, None, [[0, 1, 2]],
                                                 [[-1, 0, 0]], [3]),
    "unavailable-nodes-and-their-subtrees-never-kept": ([-1, 0, 1, 0, 3], [0.0, -INF, -0.1, float("nan"), -0.2], 5,
                                                        None, [[0, -1, -1, -1, -1]], [[-1] * 5], [1]),
    "n-one-keeps-the-root": ([[-1, 0, 0], [-1, 0, 1]], [[5.0, -1.0, -2.0], [0.0, -1.0, -1.5]], 1, None, [[0], [0]],
                             [[-1], [-1]], [1, 1]),
    "n-beyond-t-pads": ([-1, 0, 0], [0.0, -1.0, -2.0], 5, None, [[0, 1, 2, -1, -1]], [[-1, 0, 0, -1, -1]], [3]),
    "padding-nodes-are-never-kept": ([[-1, 0, 1, 99], [-1, 0, 0, 0]], [[0.0, -1.0, -2.0, 9.0], [0.0, -1.0, -0.5, 3.0]],
                                     4, [3, 3], [[0, 1, 2, -1]] * 2, [[-1, 0, 1, -1], [-1, 0, 0, -1]], [3, 3]),
}


@pytest.mark.parametrize("parents, scores, n, num_nodes, keep, new_parents, counts", SELECT_GOLDEN.values(),
                         ids=SELECT_GOLDEN)
def test_select_golden(backend, device, parents, scores, n, num_nodes, keep, new_parents, counts):
    got = select(parents, scores, n, num_nodes, backend=backend, device=device)
    assert [t.tolist() for t in got] == [keep, new_parents, counts]


# ---- select_topn_subtree: every backend vs the reference, properties ------------------------------

def _subtree_case(B, T, seed, *, monotone, ties, holes):
    g = torch.Generator().manual_seed(seed)
    nn = random_num_nodes(B, T, generator=g)
    parents = random_parents(B, T, num_nodes=nn, generator=g)
    step = -torch.rand(B, T, generator=g) * 3
    if ties:
        step = (step * 2).round() / 2
    if monotone:  # cumulative path log-probs, filled in topological order
        scores = torch.zeros(B, T)
        for i in range(1, T):
            par = parents[:, i].long().clamp(0, i - 1)
            scores[:, i] = scores[torch.arange(B), par] + step[:, i]
    else:
        scores = step
    if holes:
        scores[torch.rand(B, T, generator=g) < 0.05] = -INF
        scores[torch.rand(B, T, generator=g) < 0.02] = float("nan")
    return parents, scores, nn


@pytest.mark.parametrize("B", [1, 3, 33])
@pytest.mark.parametrize("T", [1, 7, 64, 257])
def test_subtree_matches_reference(fast_backend, device, B, T):
    if fast_backend == "triton" and device == "cpu" and B * T > 200:
        pytest.skip("the Triton interpreter is slow: a smaller grid covers it")
    for n in (1, 5, 64, 300):
        for i, (monotone, ties, holes) in enumerate([(True, False, False), (False, True, True), (True, True, True)]):
            parents, scores, nn = _subtree_case(B, T, B * T + i, monotone=monotone, ties=ties, holes=holes)
            want = specops.select_topn_subtree(parents, scores, n, nn, backend="torch")
            got = specops.select_topn_subtree(parents.to(device), scores.to(device), n, nn.to(device),
                                              backend=fast_backend)
            assert_same(got, want)


def _effective(parents, scores, nv):
    eff = [INF] * len(parents)
    for i in range(1, nv):
        s = scores[i] if scores[i] == scores[i] else -INF
        eff[i] = min(s, eff[parents[i]])  # eff[0] = inf: the root's score is not on any path
    return eff[:nv]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 4), T=st.integers(1, 60), n=st.integers(1, 70), seed=st.integers(0, 2**31 - 1),
       monotone=st.booleans(), ties=st.booleans(), holes=st.booleans())
def test_property_selection_is_a_connected_optimal_subtree_containing_the_root(B, T, n, seed, monotone, ties,
                                                                              holes, device):
    parents, scores, nn = _subtree_case(B, T, seed, monotone=monotone, ties=ties, holes=holes)
    want = specops.select_topn_subtree(parents, scores, n, nn, backend="torch")
    # The interpreted Triton kernel is exercised by the grid above; here it would dominate the time.
    for name in (b for b in _backend.BACKENDS
                 if _backend.available(b, device)[0] and (b, device) != ("triton", "cpu")):
        got = specops.select_topn_subtree(parents.to(device), scores.to(device), n, nn.to(device), backend=name)
        assert_same(got, want)
    keep, newp, counts = (t.tolist() for t in want)
    for b in range(B):
        nv, c = int(nn[b]), counts[b]
        par, sc = parents[b].tolist(), scores[b].tolist()
        eff = _effective(par, sc, nv)
        avail = [i for i in range(1, nv) if eff[i] > -INF]
        assert c == 1 + min(n - 1, len(avail))
        assert keep[b][0] == 0 and newp[b][0] == -1
        assert keep[b][c:] == [-1] * (n - c) and newp[b][c:] == [-1] * (n - c)
        kept = keep[b][:c]
        assert kept == sorted(set(kept)) and kept[-1] < nv
        for j in range(1, c):  # every kept node's parent is kept: connected, rooted
            assert 0 <= newp[b][j] < j and keep[b][newp[b][j]] == par[kept[j]]
        dropped = set(avail) - set(kept)
        if dropped and c > 1:  # optimal: nothing dropped beats anything kept
            assert min(eff[i] for i in kept[1:]) >= max(eff[i] for i in dropped)


# ---- errors (bad input: the battery of tests/test_bad_input.py) ----------------------------------

def test_n_at_the_limit_pads(backend, device):
    n = 2048 if backend in ("cuda", "cudasim") else 65536  # CUDA selects in shared memory
    s, t, p = specops.topn_expand(torch.zeros(1, 3, device=device), torch.zeros(1, 3, 5, device=device), n,
                                  backend=backend)
    assert s.shape == (1, n) and (t[0, 15:] == -1).all() and (p[0, :15] >= 0).all()


# ---- registration ---------------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("n,k", [(1, 1), (6, 2), (40, 40)])
def test_expand_opcheck(n, k):
    ps, cl = _expand_case(3, 4, 25, torch.float32, True, n)
    torch.library.opcheck(torch.ops.specops.topn_expand.default, (ps, cl, n, k))


@needs_cpp
@pytest.mark.parametrize("B,T,n", [(1, 1, 1), (3, 33, 5), (2, 70, 100)])
def test_subtree_opcheck(B, T, n):
    parents, scores, nn = _subtree_case(B, T, T, monotone=True, ties=True, holes=False)
    torch.library.opcheck(torch.ops.specops.select_topn_subtree.default, (parents, scores, nn, n))


@needs_cpp
def test_torch_compile_fullgraph_opt_tree_layer_then_selection():
    ps, cl = _expand_case(2, 6, 100, torch.float32, False, 5)
    parents, scores, nn = _subtree_case(2, 40, 9, monotone=True, ties=False, holes=False)

    def f(ps, cl, parents, scores, nn):
        s, t, p = specops.topn_expand(ps, cl.log_softmax(-1), 6, per_parent_k=6, check=False, backend="cpp")
        keep, newp, counts = specops.select_topn_subtree(parents, scores, 8, nn, check=False, backend="cpp")
        return s.exp().sum(-1), t, p, keep, newp, counts

    got = torch.compile(f, fullgraph=True)(ps, cl, parents, scores, nn)
    s, t, p = specops.topn_expand(ps, cl.log_softmax(-1), 6, per_parent_k=6, backend="torch")
    want = (s.exp().sum(-1), t, p) + specops.select_topn_subtree(parents, scores, 8, nn, backend="torch")
    torch.testing.assert_close(got[0], want[0])
    assert_same(got[1:], want[1:])
