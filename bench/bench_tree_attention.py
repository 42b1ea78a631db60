"""tree_attention on every backend against the plain-torch ways of doing the same thing.

Shapes from real configs: (Hq, Hkv, D) in {(32, 8, 128), (14, 2, 64), (9, 3, 64)}, prefix in
{256, 1024, 4096}, a random tree of {16, 64, 128} nodes (all of them queries), B in {1, 8},
fp32 and bf16; plus a chain (causal) block after the longest prefix, where flash-attn's
``flash_attn_with_kvcache`` applies. Providers:

- ``torch``: the reference backend (dense fp32 scores);
- ``hf_sdpa``: what transformers' sdpa attention does with a 4D mask — repeat_kv, then
  SDPA with a dense additive float mask (``transformers.integrations.sdpa_attention``);
- ``sdpa_gqa``: SDPA with ``enable_gqa=True`` and a boolean mask (the strongest plain-torch path);
- ``cpp``, ``triton``, ``cuda``: specops backends (triton/cuda on a GPU only);
- ``paged``: ``tree_attention_paged`` on cpp over the same K/V in pages of 16 rows scattered in a
  random order (a serving engine's cache); ``speedup_vs_cpp`` is its time against ``cpp``'s;
- ``flashinfer``: the optional FlashInfer backend of tree_attention (a GPU with flashinfer installed);
- ``flex_attention``: torch's ``torch.nn.attention.flex_attention`` under ``torch.compile`` with a
  ``BlockMask`` built from the same dense visibility (GQA through ``enable_gqa``); compiled and
  checked against the reference once per case outside the timing, recorded as skipped (with the
  reason) where the import, the compile or the check fails; ``speedup_vs_flex_attention`` is cpp's
  (and paged's) time against it;
- ``model:H100``, ``model:A100``: the roofline model's lower bound (bench/roofline.py), not a timing;
- ``flash_attn``: ``flash_attn_with_kvcache`` on the chain cases (no tree masks), when importable.
Masks of the baselines are built once outside the timing (a model builds one per forward).
FLOP counts are dense: 4 * B * Hq * Tq * (prefix + tree) * D.

    python bench/bench_tree_attention.py [--quick] [--providers cpp,sdpa_gqa]
    python bench/bench_tree_attention.py --paged-ratio [--quick] [--repeats N]
    pytest bench/bench_tree_attention.py --benchmark-only

``--paged-ratio``: cpp ``tree_attention_paged`` against cpp ``tree_attention`` on the same K/V
(pages of 16, scattered), the two timed interleaved (one sample of each in turn, medians of the
samples), at the decode shape (B 1, H 32/8, D 128, prefix 4096, tree 16, fp32; issue #31's target:
>= 0.9x) and over the grid (>= 0.8x); prints a table, the load average and the lowest ratio.
"""
import math
import os
import statistics
import sys
import time
import types

import pytest
import torch
import torch.nn.functional as F

import specops
from specops import backend as _backend
from specops.ops.tree_attention import visibility
from specops.testing import random_parents, to_pages

import roofline
from _harness import case_label, main, pytest_benchmark

PROVIDERS = ("torch", "hf_sdpa", "sdpa_gqa", "flex_attention", "cpp", "paged", "triton", "cuda", "flashinfer",
             "flash_attn")
PAGE_SIZE = 16  # the paged provider's page size (vLLM's default block size)
HEADS = [(32, 8, 128), (14, 2, 64), (9, 3, 64)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cases(quick):
    if quick:
        return ([dict(Hq=9, Hkv=3, D=64, prefix=256, tree=16, B=1, dtype=d, mask="tree") for d in DTYPES]
                + [dict(Hq=14, Hkv=2, D=64, prefix=256, tree=16, B=1, dtype="bf16", mask="chain")])
    cases = [dict(Hq=hq, Hkv=hkv, D=d, prefix=p, tree=t, B=b, dtype=dt, mask="tree")
             for dt in DTYPES for (hq, hkv, d) in HEADS for p in (256, 1024, 4096) for t in (16, 64, 128)
             for b in (1, 8)]
    cases += [dict(Hq=hq, Hkv=hkv, D=d, prefix=4096, tree=t, B=1, dtype=dt, mask="chain")
              for dt in DTYPES for (hq, hkv, d) in HEADS for t in (16, 128)]
    return cases


def inputs(Hq, Hkv, D, prefix, tree, B, dtype, mask, device):
    """The op's arguments for one case: the cache holds exactly prefix + tree rows."""
    g = torch.Generator().manual_seed(prefix + tree + B)
    dt = DTYPES[dtype]
    S = prefix + tree
    q = torch.randn(B, tree, Hq, D, generator=g).to(dt).to(device)
    k = torch.randn(B, Hkv, S, D, generator=g).to(dt).to(device)
    v = torch.randn(B, Hkv, S, D, generator=g).to(dt).to(device)
    if mask == "chain":
        parents = torch.arange(-1, tree - 1, dtype=torch.int32).expand(B, tree).contiguous()
    else:
        parents = random_parents(B, tree, generator=g)
    packed = specops.build_tree_mask(parents.to(device), backend="torch")[0]
    lens = lambda n: torch.full((B,), n, dtype=torch.int32, device=device)  # noqa: E731
    return q, k, v, lens(prefix), lens(tree), packed


def _providers(rec, params, args):
    """(name, fn) for every provider that can run here; records a skip for the others."""
    q, k, v, prefix_lens, block_lens, packed = args
    B, Tq, Hq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    vis = visibility(prefix_lens, block_lens, packed, None, S)[:, None]  # [B, 1, Tq, S] bool
    qt = q.transpose(1, 2)  # [B, Hq, Tq, D]: the layout HF and SDPA take
    out = []
    for provider in PROVIDERS:
        if not rec.wants(provider):
            continue
        if provider == "torch":
            fn = lambda: specops.tree_attention(*args, check=False, backend="torch")  # noqa: E731
        elif provider == "hf_sdpa":
            try:
                from transformers.integrations.sdpa_attention import sdpa_attention_forward
            except ImportError as err:
                rec.skip(provider, params, f"transformers not importable ({err})")
                continue
            module = types.SimpleNamespace(num_key_value_groups=Hq // Hkv, is_causal=False, training=False)
            fmask = torch.zeros(vis.shape, dtype=q.dtype, device=q.device).masked_fill(~vis, torch.finfo(q.dtype).min)
            fn = lambda m=module, f=fmask: sdpa_attention_forward(m, qt, k, v, f, scaling=1 / math.sqrt(D))  # noqa: E731
        elif provider == "sdpa_gqa":
            fn = lambda: F.scaled_dot_product_attention(qt, k, v, attn_mask=vis, enable_gqa=True)  # noqa: E731
        elif provider == "paged":
            ok, why = _backend.available("cpp", rec.device)
            if not ok:
                rec.skip(provider, params, why)
                continue
            fn = _paged_fn(args)
        elif provider == "flex_attention":
            fn, reason = _flex_attention(qt, k, v, vis, args)
            if reason:
                rec.skip(provider, params, reason)
                continue
        elif provider == "flash_attn":
            reason = _flash_attn_unavailable(rec.device, params)
            if reason:
                rec.skip(provider, params, reason)
                continue
            from flash_attn import flash_attn_with_kvcache

            kc, vc = k.transpose(1, 2), v.transpose(1, 2)  # [B, S, Hkv, D] views: no copy in the timing
            seqlens = (prefix_lens + block_lens).contiguous()
            fn = lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True)  # noqa: E731
        else:
            ok, why = _backend.available(provider, rec.device)
            if provider == "triton" and rec.device == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            if not ok:
                rec.skip(provider, params, why)
                continue
            fn = lambda p=provider: specops.tree_attention(*args, check=False, backend=p)  # noqa: E731
        out.append((provider, fn))
    return out


def _paged_fn(args):
    """cpp tree_attention_paged over the K/V of ``args`` (inputs()) in pages of PAGE_SIZE rows,
    scattered in a random order (the same permutation for K and V: one page table)."""
    q, k, v, prefix_lens, block_lens, packed = args
    kp, table = to_pages(k, PAGE_SIZE, generator=torch.Generator().manual_seed(0), fill=0.0)
    vp, _ = to_pages(v, PAGE_SIZE, generator=torch.Generator().manual_seed(0), fill=0.0)
    return lambda: specops.tree_attention_paged(q, kp, vp, table, prefix_lens, block_lens, packed, check=False,
                                                backend="cpp")


DECODE = dict(Hq=32, Hkv=8, D=128, prefix=4096, tree=16, B=1, dtype="fp32", mask="tree")


def paged_ratio(cases, repeats=15, sample_s=0.02):
    """Contiguous / paged time of cpp tree_attention per case, timed interleaved: each sample runs
    one fn enough calls to last ~``sample_s``, contiguous and paged alternate, ``repeats`` samples
    each. -> [(params, contiguous ms, paged ms, ratio of the medians)]."""
    rows = []
    for params in cases:
        args = inputs(**params, device="cpu")
        fns = (lambda: specops.tree_attention(*args, check=False, backend="cpp"), _paged_fn(args))
        for fn in fns * 2:  # warm-up
            fn()
        t0 = time.perf_counter()
        fns[0]()
        inner = max(1, int(sample_s / max(time.perf_counter() - t0, 1e-6)))
        times = ([], [])
        for _ in range(repeats):
            for fn, out in zip(fns, times):
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                out.append((time.perf_counter() - t0) / inner * 1e3)
        c, p = statistics.median(times[0]), statistics.median(times[1])
        rows.append((params, c, p, c / p))
        print(f"{case_label(params):60s} contiguous {c:9.3f} ms  paged {p:9.3f} ms  {c / p:.3f}x", flush=True)
    return rows


def _paged_ratio_main(argv):
    quick, repeats = "--quick" in argv, 15
    if "--repeats" in argv:
        repeats = int(argv[argv.index("--repeats") + 1])
    ok, why = _backend.available("cpp", "cpu")
    if not ok:
        sys.exit(f"cpp backend unavailable: {why}")
    print(f"specops {specops.__file__}, threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    decode = paged_ratio([DECODE], repeats)[0][3]
    grid = paged_ratio([c for c in _cases(quick) if c != DECODE], repeats)
    low = min(grid, key=lambda r: r[3])
    print(f"decode shape: {decode:.3f}x contiguous (target >= 0.9); lowest in the grid: {low[3]:.3f}x at "
          f"{case_label(low[0])} (target >= 0.8); load average {os.getloadavg()}")


_FLEX = {}  # the torch.compile'd flex_attention, shared by every case (compiled per shape on first use)


def _flex_attention(qt, k, v, vis, args):
    """(fn, None) running compiled flex_attention with a BlockMask from ``vis`` [B, 1, Tq, S], or
    (None, why not). The BlockMask is built, the kernel compiled and its result compared with the
    torch reference here, outside the timing.

    Shape: qt [B, Hq, Tq, D], k / v [B, Hkv, S, D] -> fn() -> [B, Hq, Tq, D]."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as err:
        return None, f"flex_attention not importable ({err})"
    B, Hq, Tq, D = qt.shape
    dense = vis[:, 0].contiguous()  # [B, Tq, S] bool

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[b, q_idx, kv_idx]

    try:
        if "fn" not in _FLEX:
            # One compile per case shape: past dynamo's default limit of 8 recompiles, flex_attention
            # would silently fall back to its unfused eager path (scores materialised) and the
            # provider would time that instead of the compiled kernel.
            import torch._dynamo as dynamo

            cfg = dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, 4096)
            cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 65536)
            _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        block_mask = _block_mask(dense, mask_mod)
        gqa = Hq != k.shape[1]
        fn = lambda: _FLEX["fn"](qt, k, v, block_mask=block_mask, enable_gqa=gqa)  # noqa: E731
        got = fn().transpose(1, 2)  # [B, Tq, Hq, D]; the first call compiles
    except Exception as err:  # noqa: BLE001 - any failure to build or compile is a recorded skip
        return None, f"flex_attention compile failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    want = specops.tree_attention(*args, check=False, backend="torch")
    tol = 1e-3 if qt.dtype == torch.float32 else 3e-2
    if not torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
        err = (got.float() - want.float()).abs().max().item()
        return None, f"flex_attention result differs from the reference (max abs error {err:.3g})"
    return fn, None


def _block_mask(dense, mask_mod, block=128):
    """flex_attention's BlockMask of a dense visibility ``dense`` [B, Tq, S] bool, built from its
    block summaries with tensor ops (create_block_mask evaluates mask_mod under vmap over every
    (q, kv) pair, which took minutes on GPU for these shapes): blocks with every entry visible are
    full (no mask_mod call), blocks with some are partial (mask_mod decides), the rest are skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    B, Tq, S = dense.shape
    nq, nk = -(-Tq // block), -(-S // block)
    padded = torch.zeros(B, nq * block, nk * block, dtype=torch.bool, device=dense.device)
    padded[:, :Tq, :S] = dense
    tiles = padded.view(B, nq, block, nk, block)
    some, every = tiles.any(4).any(2), tiles.all(4).all(2)  # [B, nq, nk]

    def table(sel):  # [B, nq, nk] bool -> counts [B, 1, nq], selected block indices first [B, 1, nq, nk]
        order = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)
        return sel.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    partial, full = table(some & ~every), table(every)
    return BlockMask.from_kv_blocks(*partial, *full, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(Tq, S))


def _flash_attn_unavailable(device, params):
    if params["mask"] != "chain":
        return "flash-attn has no tree masks (chain cases only)"
    if torch.device(device).type != "cuda":
        return "flash-attn needs a CUDA device"
    try:
        import flash_attn  # noqa: F401
    except ImportError as err:
        return f"flash_attn not importable ({err}); it cannot be built on these machines"
    return None


def measure(rec, quick):
    for params in _cases(quick):
        args = inputs(**params, device=rec.device)
        S = params["prefix"] + params["tree"]
        flop = 4 * params["B"] * params["Hq"] * params["tree"] * S * params["D"]
        for provider, fn in _providers(rec, params, args):
            rec.time(provider, params, fn, flop=flop, memory=True)
        roofline.record(rec, params)
    rec.add_ratios("hf_sdpa")
    rec.add_ratios("sdpa_gqa")
    rec.add_ratios("cpp", over=("paged",))
    rec.add_ratios("flex_attention", over=("cpp", "paged"))


SMALL = [dict(Hq=14, Hkv=2, D=64, prefix=1024, tree=64, B=1, dtype=d, mask="tree") for d in DTYPES]


@pytest.mark.parametrize("params", SMALL, ids=lambda p: p["dtype"])
@pytest.mark.parametrize("provider", ["sdpa_gqa", "cpp"])
def test_tree_attention(benchmark, provider, params):
    if provider == "cpp" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    args = inputs(**params, device="cpu")
    q, k, v, prefix_lens, block_lens, packed = args
    if provider == "cpp":
        fn = lambda: specops.tree_attention(*args, check=False, backend="cpp")  # noqa: E731
    else:
        vis = visibility(prefix_lens, block_lens, packed, None, k.shape[2])[:, None]
        fn = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=vis, enable_gqa=True)  # noqa: E731
    pytest_benchmark(benchmark, fn, provider=provider, **params)


if __name__ == "__main__":
    if "--paged-ratio" in sys.argv:
        _paged_ratio_main(sys.argv[1:])
    else:
        main("tree_attention", measure)
