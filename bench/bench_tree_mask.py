"""build_tree_mask on every backend: B in {1, 64}, T in {16, 64, 256} random trees.

    python bench/bench_tree_mask.py [--quick]        # CSV under bench/results/<machine>/
    pytest bench/bench_tree_mask.py --benchmark-only
"""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.testing import random_parents

from _harness import main, pytest_benchmark

PROVIDERS = ("torch", "cpp", "triton", "cuda")
CASES = [dict(B=B, T=T) for B in (1, 64) for T in (16, 64, 256)]


def inputs(B, T, device):
    parents = random_parents(B, T, generator=torch.Generator().manual_seed(T), device=device)
    return parents, torch.full((B,), T, dtype=torch.int32, device=device)


def measure(rec, quick):
    for params in CASES[:2] if quick else CASES:
        parents, nn = inputs(**params, device=rec.device)
        # bytes the op must at least write: mask + depth
        out_bytes = params["B"] * params["T"] * ((params["T"] + 31) // 32 + 1) * 4
        for provider in PROVIDERS:
            ok, why = _backend.available(provider, rec.device)
            if provider == "triton" and rec.device == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            if not ok:
                rec.skip(provider, params, why)
                continue
            rec.time(provider, params,
                     lambda p=provider: specops.build_tree_mask(parents, nn, check=False, backend=p),
                     bytes=out_bytes)
    rec.add_ratios("torch")


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"B{p['B']}-T{p['T']}")
@pytest.mark.parametrize("provider", ["torch", "cpp"])
def test_build_tree_mask(benchmark, provider, params):
    if not _backend.available(provider)[0]:
        pytest.skip(_backend.available(provider)[1])
    parents, nn = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, lambda: specops.build_tree_mask(parents, nn, check=False, backend=provider),
                     provider=provider, **params)


if __name__ == "__main__":
    main("tree_mask", measure)
