"""kv_compact against what peers do, with memcpy of the same bytes as the physical limit.

Shapes: L in {24, 32}, B in {1, 8}, (Hkv, D) in {(8, 128), (2, 64)}, S = 4096, n in
{1, 4, 16} accepted nodes of a 64-node block (a random increasing subset of nodes 1..63 per
sequence, so every accepted row really moves), fp32 and bf16.

Providers, all timed in the same run:
  per_layer_loop   what HF / EAGLE code does: per layer and cache, index_select + copy_ into the
                   destination slice (B = 1), or index_select + index_copy_ of flat rows (B > 1)
  stacked_gather   one index_select + one index_copy_ over the stacked cache (Medusa style)
  cpp              specops.kv_compact(check=False); cpp_checked: with the value checks (one sync)
  cpp_paged        specops.kv_compact_paged(check=False) on the same shape in pages of 16 rows,
                   scattered in a random order (a serving engine's cache; other bytes)
  cpp_raw          the compiled op called directly (torch.ops.specops.kv_compact: no Python checks,
                   no dispatch): the floor a Python caller can reach
  plan, plan_paged a specops.KVCompactPlan (check=True) built outside the timing, plan.run(k, v) per
                   call: what the cache and the loop do per step; derived overhead_vs_cpp_raw (us, plan only)
  triton, cuda     when a GPU exists
  memcpy_clone     clone() of a tensor holding the bytes the op moves: the physical limit
Bytes counted: every moved row is read once and written once, in K and V.
Derived: speedup_vs_memcpy_clone (= fraction of memcpy bandwidth), speedup_vs_per_layer_loop and,
for the plans, overhead_vs_cpp_raw = plan time - cpp_raw time in microseconds (issue #17's target:
<= 3 us) and speedup_vs_cpp (the one-shot op with check=False against the plan).
The torch reference (a full-S gather map, the spec) is not timed: it rewrites the whole cache.

    python bench/bench_kv_compact.py [--quick]       # CSV under bench/results/<machine>/
    pytest bench/bench_kv_compact.py --benchmark-only
"""
import json

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


def caches(L, B, H, D, S, dtype, device):
    # uniform_ touches every page up front, so no first-touch page fault lands in a timed call.
    shape, dt = (L, B, H, S, D), DTYPES[dtype]
    return (torch.empty(shape, dtype=dt, device=device).uniform_(-1, 1) for _ in range(2))


def accepted(B, S, n, device, seed=0):
    """prefix_lens [B], accept_idx [B, n] (nodes 1..63 of a 64-node block), accept_lens [B]."""
    g = torch.Generator().manual_seed(seed * 100 + B * 10 + n)
    idx = torch.stack([torch.randperm(BLOCK - 1, generator=g)[:n].sort().values + 1 for _ in range(B)])
    prefix = torch.randint(0, S - BLOCK + 1, (B,), generator=g)
    i32 = dict(dtype=torch.int32, device=device)
    return prefix.to(**i32), idx.to(**i32), torch.full((B,), n, **i32)


PAGE_SIZE = 16  # cpp_paged's page size (vLLM's default block size)


def paged_caches(L, B, H, D, S, dtype, device):
    """K and V pools [L, B * S / 16, 16, H, D] (random bytes) and a page table [B, S / 16] whose
    pages are a random permutation of the pool."""
    n = S // PAGE_SIZE
    shape, dt = (L, B * n, PAGE_SIZE, H, D), DTYPES[dtype]
    k, v = (torch.empty(shape, dtype=dt, device=device).uniform_(-1, 1) for _ in range(2))
    table = torch.randperm(B * n, generator=torch.Generator().manual_seed(B * S)).view(B, n)
    return k, v, table.to(torch.int32).to(device)


def inputs(L, B, H, D, S, n, dtype, device):
    return (*caches(L, B, H, D, S, dtype, device), *accepted(B, S, n, device))


def _flat_rows(prefix, idx, H, S):
    """Row numbers, in a [B * H * S, D] view of one layer, of every source and destination.

    Shape: prefix int32 [B], idx int32 [B, n] -> (src, dst) int64 [B * H * n]."""
    B, n = idx.shape
    slice0 = (torch.arange(B * H, device=idx.device) * S).view(B, H, 1)
    src = slice0 + (prefix[:, None] + idx).long()[:, None, :]
    dst = slice0 + (prefix[:, None] + torch.arange(n, device=idx.device)).long()[:, None, :]
    return src.flatten(), dst.flatten()


def per_layer_loop(k, v, prefix, idx):
    """HF / EAGLE style: a Python loop over layers (and K, V) of index_select + copy_.
    B = 1 exactly as EAGLE writes it; B > 1 with flat row indices and index_copy_."""
    L, B, H, S, D = k.shape
    n = idx.shape[1]
    if B == 1:
        p = int(prefix[0])
        src = (prefix[0] + idx[0]).long()
        for cache in (k, v):
            for l in range(L):
                cache[l].narrow(-2, p, n).copy_(cache[l].index_select(-2, src))
        return
    src, dst = _flat_rows(prefix, idx, H, S)
    for cache in (k, v):
        for l in range(L):
            rows = cache[l].view(B * H * S, D)
            rows.index_copy_(0, dst, rows.index_select(0, src))


def stacked_gather(k, v, prefix, idx):
    """Medusa style: one gather of every layer's sources over the stacked cache, then one copy."""
    L, B, H, S, D = k.shape
    src, dst = _flat_rows(prefix, idx, H, S)
    layer0 = (torch.arange(L, device=k.device) * (B * H * S))[:, None]
    src, dst = (layer0 + src[None, :]).flatten(), (layer0 + dst[None, :]).flatten()
    for cache in (k, v):
        rows = cache.view(L * B * H * S, D)
        rows.index_copy_(0, dst, rows.index_select(0, src))


def providers(device):
    names = ["per_layer_loop", "stacked_gather", "cpp", "cpp_checked", "cpp_paged", "cpp_raw", "plan", "plan_paged",
             "triton", "cuda"]
    compiled = "cuda" if torch.device(device).type == "cuda" else "cpp"  # what cpp_raw and the plans run
    out = {}
    for name in names:
        base = name.split("_")[0] if name.startswith("cpp") else name
        if name in ("cpp_raw", "plan", "plan_paged"):
            base = compiled
        if base in _backend.BACKENDS:
            ok, why = _backend.available(base, device)
            if base == "triton" and torch.device(device).type == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            out[name] = (ok, why)
        else:
            out[name] = (True, "")
    return out


def make_plan(k, prefix, idx, lens, paged=None):
    """A KVCompactPlan (checked, default backend) for the contiguous cache ``k`` or for ``paged``."""
    L, B, H, S, D = k.shape
    geo = dict(num_layers=L, num_kv_heads=H, head_dim=D, dtype=k.dtype)
    if paged is None:
        return specops.KVCompactPlan(prefix, idx, lens, max_len=S, **geo)
    kp, _, table = paged
    return specops.KVCompactPlan(prefix, idx, lens, page_table=table, page_size=kp.shape[2], num_pages=kp.shape[1],
                                 **geo)


def run_provider(name, k, v, prefix, idx, lens, paged=None):
    if name == "cpp_raw":
        op = torch.ops.specops.kv_compact.default
        return lambda: op(k, v, prefix, idx, lens)
    if name in ("plan", "plan_paged"):
        plan = make_plan(k, prefix, idx, lens, paged if name == "plan_paged" else None)
        target = paged[:2] if name == "plan_paged" else (k, v)
        plan.run(*target)  # the first run checks the tensors: outside the timing
        return lambda: plan.run(*target)
    if name == "cpp_paged":
        return lambda: specops.kv_compact_paged(*paged, prefix, idx, lens, check=False, backend="cpp")
    if name == "per_layer_loop":
        return lambda: per_layer_loop(k, v, prefix, idx)
    if name == "stacked_gather":
        return lambda: stacked_gather(k, v, prefix, idx)
    backend = "cpp" if name.startswith("cpp") else name
    check = name == "cpp_checked"
    return lambda: specops.kv_compact(k, v, prefix, idx, lens, check=check, backend=backend)


def measure(rec, quick):
    cases = QUICK if quick else CASES
    shapes = {tuple((k, v) for k, v in p.items() if k != "n"): [] for p in cases}
    for p in cases:
        shapes[tuple((k, v) for k, v in p.items() if k != "n")].append(p["n"])
    for shape, ns in shapes.items():  # one cache pair per shape, reused for every n
        shape = dict(shape)
        k, v = caches(**shape, device=rec.device)
        paged = (paged_caches(**shape, device=rec.device) if rec.wants("cpp_paged") or rec.wants("plan_paged")
                 else None)
        for n in ns:
            params = {**shape, "n": n}
            prefix, idx, lens = accepted(shape["B"], shape["S"], n, rec.device)
            L, B, H, D = shape["L"], shape["B"], shape["H"], shape["D"]
            moved = 2 * L * B * H * n * D * k.element_size()  # K and V rows the op reads (and writes)
            same_bytes = torch.empty(moved // 2, dtype=torch.int16, device=rec.device)
            rec.time("memcpy_clone", params, same_bytes.clone, bytes=2 * moved)
            for name, (ok, why) in providers(rec.device).items():
                if not ok:
                    rec.skip(name, params, why)
                    continue
                rec.time(name, params, run_provider(name, k, v, prefix, idx, lens, paged), bytes=2 * moved)
        del k, v, paged
    rec.add_ratios("memcpy_clone")
    rec.add_ratios("per_layer_loop")
    rec.add_ratios("cpp", over=("plan",))
    rec.add_ratios("cpp_paged", over=("plan_paged",))
    _overheads(rec)


def _overheads(rec):
    """overhead_vs_cpp_raw (us) of the contiguous plan: its time minus the raw compiled op's, same
    case (the table prints only times and ratios, so the overheads are printed here too)."""
    times = {(r["case"], r["provider"]): (r["p50"], r["params"]) for r in rec.rows if r["metric"] == "time"}
    for (case, provider), (t, params) in times.items():
        raw = times.get((case, "cpp_raw"))
        if raw is not None and provider == "plan":
            us = (t - raw[0]) * 1e3
            rec.value(provider, json.loads(params), "overhead_vs_cpp_raw", "us", us)
            print(f"# {case}: plan - cpp_raw = {us:.2f} us per call")


@pytest.mark.parametrize("params", QUICK, ids=lambda p: f"B{p['B']}-n{p['n']}-{p['dtype']}")
@pytest.mark.parametrize("provider", ["per_layer_loop", "stacked_gather", "cpp", "plan"])
def test_kv_compact(benchmark, provider, params):
    if provider in ("cpp", "plan") and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    args = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, run_provider(provider, *args), provider=provider, **params)


if __name__ == "__main__":
    main("kv_compact", measure)
