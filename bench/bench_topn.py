"""topn_expand and select_topn_subtree on every backend against plain torch.topk.

topn_expand cases are the three uses: an OPT-Tree layer (P = n parents, per_parent_k = n), a
beam step (P = n = M beams) and TSD/GSD's top-k per frontier node (per_parent_k = k, n = P * k).
Providers: ``torch`` (the reference: stable sorts), ``topk`` (the vectorised torch.topk approach
drafters use: per-parent topk, then a global topk over the flattened candidates; same result
without ties), ``cpp``, and ``triton`` / ``cuda`` on a GPU. Bytes: the child log-probs read once.
select_topn_subtree cases are OPT-Tree's final choice (n + 1 of depth x n nodes); ``topk`` there
is topk + sort + searchsorted re-indexing (right only for monotone scores without ties).

    python bench/bench_topn.py [--quick]             # CSV under bench/results/<machine>/
    pytest bench/bench_topn.py --benchmark-only
"""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.testing import random_parents

from _harness import main, pytest_benchmark

PROVIDERS = ("torch", "topk", "cpp", "triton", "cuda")
EXPAND = ([dict(use="opt_tree", B=B, P=n, V=V, n=n, k=n) for B in (1, 8) for n in (25, 60) for V in (32000,)]
          + [dict(use="beam", B=B, P=8, V=V, n=8, k=8) for B in (1, 8) for V in (32000, 151936)]
          + [dict(use="tsd", B=B, P=P, V=32000, n=4 * P, k=4) for B in (1, 8) for P in (4, 16)])
SUBTREE = [dict(use="opt_tree_final", B=B, T=T, n=n) for B in (1, 8, 64) for T, n in ((251, 51), (601, 61))]
QUICK_EXPAND = [dict(use="opt_tree", B=1, P=25, V=32000, n=25, k=25), dict(use="beam", B=8, P=8, V=32000, n=8, k=8)]
QUICK_SUBTREE = [dict(use="opt_tree_final", B=8, T=251, n=51)]


def expand_inputs(B, P, V, device, **_):
    g = torch.Generator().manual_seed(B * P + V)
    ps = -torch.rand(B, P, generator=g) * 4
    cl = torch.log_softmax(torch.randn(B, P, V, generator=g) * 3, dim=-1)
    return ps.to(device), cl.to(device)


def topk_expand(ps, cl, n, k):
    B, P, V = cl.shape
    if k < V:
        vals, toks = cl.topk(k, dim=-1)
        s, i = (ps[:, :, None] + vals).flatten(1).topk(min(n, P * k), dim=-1)
        return s, toks.flatten(1).gather(1, i), i // k
    s, i = (ps[:, :, None] + cl).flatten(1).topk(n, dim=-1)
    return s, i % V, i // V


def subtree_inputs(B, T, device, **_):
    g = torch.Generator().manual_seed(B * T)
    parents = random_parents(B, T, generator=g)
    scores = torch.zeros(B, T)
    step = -torch.rand(B, T, generator=g) * 3
    for i in range(1, T):
        scores[:, i] = scores[torch.arange(B), parents[:, i].long()] + step[:, i]
    return parents.to(device), scores.to(device), torch.full((B,), T, dtype=torch.int32, device=device)


def topk_subtree(parents, scores, n):
    s = scores.clone()
    s[:, 0] = float("inf")
    keep = s.topk(n, dim=-1).indices.sort(dim=-1).values
    par = parents.gather(1, keep).clamp(min=0).long()
    return keep, torch.searchsorted(keep, par), None


def _skip_reason(rec, provider):
    if provider == "topk":
        return None
    ok, why = _backend.available(provider, rec.device)
    if provider == "triton" and rec.device == "cpu":
        ok, why = False, "interpreter only on CPU (not a timing)"
    return None if ok else why


def measure(rec, quick):
    for params in QUICK_EXPAND if quick else EXPAND:
        ps, cl = expand_inputs(**params, device=rec.device)
        n, k = params["n"], params["k"]
        for provider in PROVIDERS:
            why = _skip_reason(rec, provider)
            if why:
                rec.skip(provider, params, why)
                continue
            fn = (lambda: topk_expand(ps, cl, n, k)) if provider == "topk" else (
                lambda p=provider: specops.topn_expand(ps, cl, n, per_parent_k=k, check=False, backend=p))
            rec.time(provider, params, fn, bytes=cl.numel() * cl.element_size())
    for params in QUICK_SUBTREE if quick else SUBTREE:
        parents, scores, nn = subtree_inputs(**params, device=rec.device)
        n = params["n"]
        for provider in PROVIDERS:
            why = _skip_reason(rec, provider)
            if why:
                rec.skip(provider, params, why)
                continue
            fn = (lambda: topk_subtree(parents, scores, n)) if provider == "topk" else (
                lambda p=provider: specops.select_topn_subtree(parents, scores, n, nn, check=False, backend=p))
            rec.time(provider, params, fn)
    rec.add_ratios("torch")
    rec.add_ratios("topk")


@pytest.mark.parametrize("params", QUICK_EXPAND, ids=lambda p: f"{p['use']}-B{p['B']}")
@pytest.mark.parametrize("provider", ["topk", "cpp"])
def test_topn_expand(benchmark, provider, params):
    if provider == "cpp" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    ps, cl = expand_inputs(**params, device="cpu")
    n, k = params["n"], params["k"]
    fn = (lambda: topk_expand(ps, cl, n, k)) if provider == "topk" else (
        lambda: specops.topn_expand(ps, cl, n, per_parent_k=k, check=False, backend="cpp"))
    pytest_benchmark(benchmark, fn, provider=provider, **params)


if __name__ == "__main__":
    main("topn", measure)
