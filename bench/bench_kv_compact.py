"""kv_compact against what peers do, with memcpy of the same bytes as the physical limit.

Shapes (issue 3): L in {24, 32}, B in {1, 8}, (Hkv, D) in {(8, 128), (2, 64)}, S = 4096, n in
{1, 4, 16} accepted nodes of a 64-node block (a random increasing subset of nodes 1..63 per
sequence, so every accepted row really moves), fp32 and bf16.

Providers, all timed in the same run:
  per_layer_loop   what HF / EAGLE code does: per layer and cache, index_select + copy_ into the
                   destination slice (B = 1), or gather + scatter_ along S (B > 1)
  stacked_gather   one gather + one scatter_ over the stacked [L, B, H, S, D] tensor (Medusa style)
  cpp              specops.kv_compact(check=False); cpp_checked: with the value checks (one sync)
  triton, cuda     when a GPU exists
  memcpy_clone     clone() of a tensor holding the bytes the op moves: the physical limit
Bytes counted: every moved row is read once and written once, in K and V.
Derived: speedup_vs_memcpy_clone (= fraction of memcpy bandwidth) and speedup_vs_per_layer_loop.
The torch reference (a full-S gather map, the spec) is not timed: it rewrites the whole cache.

    python bench/bench_kv_compact.py [--quick]       # CSV under bench/results/<machine>/
    pytest bench/bench_kv_compact.py --benchmark-only
"""
import pytest
import torch

import specops
from specops import backend as _backend

from _harness import main, pytest_benchmark

BLOCK = 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CASES = [dict(L=L, B=B, H=H, D=D, S=4096, n=n, dtype=dt)
         for dt in DTYPES for L in (24, 32) for B in (1, 8) for H, D in ((8, 128), (2, 64)) for n in (1, 4, 16)]
QUICK = [dict(L=2, B=B, H=2, D=64, S=256, n=n, dtype=dt) for dt in DTYPES for B in (1, 3) for n in (1, 16)]


def inputs(L, B, H, D, S, n, dtype, device):
    g = torch.Generator().manual_seed(L * 1000 + B * 100 + n)
    k = torch.randn(L, B, H, S, D, generator=g).to(device=device, dtype=DTYPES[dtype])
    v = torch.randn(L, B, H, S, D, generator=g).to(device=device, dtype=DTYPES[dtype])
    idx = torch.stack([torch.randperm(BLOCK - 1, generator=g)[:n].sort().values + 1 for _ in range(B)])
    prefix = torch.randint(0, S - BLOCK + 1, (B,), generator=g)
    i32 = dict(dtype=torch.int32, device=device)
    return k, v, prefix.to(**i32), idx.to(**i32), torch.full((B,), n, **i32)


def per_layer_loop(k, v, prefix, idx):
    """HF / EAGLE style: a Python loop over layers (and K, V) of gather + copy."""
    L, B, H, S, D = k.shape
    n = idx.shape[1]
    if B == 1:
        p = int(prefix[0])
        src = (prefix[0] + idx[0]).long()
        for cache in (k, v):
            for l in range(L):
                cache[l].narrow(-2, p, n).copy_(cache[l].index_select(-2, src))
        return
    src = (prefix[:, None] + idx).long()[:, None, :, None].expand(B, H, n, D)
    dst = (prefix[:, None] + torch.arange(n, device=k.device)).long()[:, None, :, None].expand(B, H, n, D)
    for cache in (k, v):
        for l in range(L):
            cache[l].scatter_(2, dst, cache[l].gather(2, src))


def stacked_gather(k, v, prefix, idx):
    """Medusa style: one gather of all sources over the stacked cache, then one scatter."""
    L, B, H, S, D = k.shape
    n = idx.shape[1]
    src = (prefix[:, None] + idx).long()[None, :, None, :, None].expand(L, B, H, n, D)
    dst = (prefix[:, None] + torch.arange(n, device=k.device)).long()[None, :, None, :, None].expand(L, B, H, n, D)
    for cache in (k, v):
        cache.scatter_(3, dst, cache.gather(3, src))


def providers(device):
    names = ["per_layer_loop", "stacked_gather", "cpp", "cpp_checked", "triton", "cuda"]
    out = {}
    for name in names:
        base = name.split("_")[0] if name.startswith("cpp") else name
        if base in _backend.BACKENDS:
            ok, why = _backend.available(base, device)
            if base == "triton" and torch.device(device).type == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            out[name] = (ok, why)
        else:
            out[name] = (True, "")
    return out


def run_provider(name, k, v, prefix, idx, lens):
    if name == "per_layer_loop":
        return lambda: per_layer_loop(k, v, prefix, idx)
    if name == "stacked_gather":
        return lambda: stacked_gather(k, v, prefix, idx)
    backend = "cpp" if name.startswith("cpp") else name
    check = name == "cpp_checked"
    return lambda: specops.kv_compact(k, v, prefix, idx, lens, check=check, backend=backend)


def measure(rec, quick):
    for params in QUICK if quick else CASES:
        k, v, prefix, idx, lens = inputs(**params, device=rec.device)
        L, B, H, D, n = params["L"], params["B"], params["H"], params["D"], params["n"]
        moved = 2 * L * B * H * n * D * k.element_size()  # K and V rows the op reads (and writes)
        same_bytes = torch.empty(moved // 2, dtype=torch.int16, device=rec.device)
        rec.time("memcpy_clone", params, same_bytes.clone, bytes=2 * moved)
        for name, (ok, why) in providers(rec.device).items():
            if not ok:
                rec.skip(name, params, why)
                continue
            rec.time(name, params, run_provider(name, k, v, prefix, idx, lens), bytes=2 * moved)
        del k, v
    rec.add_ratios("memcpy_clone")
    rec.add_ratios("per_layer_loop")


@pytest.mark.parametrize("params", QUICK, ids=lambda p: f"B{p['B']}-n{p['n']}-{p['dtype']}")
@pytest.mark.parametrize("provider", ["per_layer_loop", "stacked_gather", "cpp"])
def test_kv_compact(benchmark, provider, params):
    if provider == "cpp" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    args = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, run_provider(provider, *args), provider=provider, **params)


if __name__ == "__main__":
    main("kv_compact", measure)
