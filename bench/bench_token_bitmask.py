"""apply_token_bitmask: cpp against the torch reference and a naive masked_fill, V in {32K, 128K},
rows in {1, 8, 64}, fp32 and bf16 logits, masks allowing ~5 % of tokens (a grammar state inside a
JSON string allows most tokens, one between keys a few: the cost of the op does not depend on it
much, the writes do).

    python bench/bench_token_bitmask.py [--quick]        # CSV under bench/results/<machine>/
    pytest bench/bench_token_bitmask.py --benchmark-only

``naive`` is what a caller without the op writes: unpack the mask to a bool tensor and
``masked_fill_`` (the torch reference does the same, from the packed words with one shift).
"""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.ops.token_bitmask import apply_token_bitmask

from _harness import main, pytest_benchmark

PROVIDERS = ("torch", "naive", "cpp", "triton", "cuda")
CASES = [dict(rows=rows, V=V, dtype=dtype) for V in (32768, 131072) for rows in (1, 8, 64)
         for dtype in ("fp32", "bf16")]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def inputs(rows, V, dtype, device):
    g = torch.Generator().manual_seed(V + rows)
    logits = torch.randn(rows, V, generator=g).to(DTYPES[dtype]).to(device)
    allowed = torch.rand(rows, V, generator=g) < 0.05
    allowed[:, 0] = True
    return logits, specops.pack_mask(allowed).to(device)


def naive(logits, bitmask):
    """Unpack every bit to a bool (an int64 shift per token), then masked_fill_."""
    V = logits.shape[-1]
    bits = (bitmask.to(torch.int64)[..., None] >> torch.arange(32, device=bitmask.device)) & 1
    logits.masked_fill_(bits.flatten(-2)[..., :V] == 0, float("-inf"))
    return logits


def call(provider, logits, bitmask):
    if provider == "naive":
        return lambda: naive(logits, bitmask)
    return lambda: apply_token_bitmask(logits, bitmask, check=False, backend=provider)


def measure(rec, quick):
    for params in CASES[:4] if quick else CASES:
        logits, bitmask = inputs(**params, device=rec.device)
        # bytes the op must at least move: read the mask, write the disallowed logits (~95 %)
        out_bytes = bitmask.numel() * 4 + int(0.95 * logits.numel()) * logits.element_size()
        for provider in PROVIDERS:
            ok, why = (True, "") if provider == "naive" else _backend.available(provider, rec.device)
            if provider == "triton" and rec.device == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            if not ok:
                rec.skip(provider, params, why)
                continue
            # In place and idempotent: repeated calls on the same logits do the same work.
            rec.time(provider, params, call(provider, logits, bitmask), bytes=out_bytes)
    rec.add_ratios("torch")
    rec.add_ratios("naive")


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"rows{p['rows']}-V{p['V']}-{p['dtype']}")
@pytest.mark.parametrize("provider", ["torch", "naive", "cpp"])
def test_apply_token_bitmask(benchmark, provider, params):
    if provider != "naive" and not _backend.available(provider)[0]:
        pytest.skip(_backend.available(provider)[1])
    logits, bitmask = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, call(provider, logits, bitmask), provider=provider, **params)


if __name__ == "__main__":
    main("token_bitmask", measure)
