"""specops.linear against torch's F.linear on SmolLM2-135M's projections, M = 1 to 64 rows.

    python bench/bench_linear.py [--quick] [--providers F.linear,cpp]   # CSV under bench/results/<machine>/
    pytest bench/bench_linear.py --benchmark-only

The shapes are the model's: q/o 576x576, k/v 192x576, fused qkv 960x576, gate/up 1536x576 (fused
3072x576), down 576x1536 and the tied LM head 49152x576. A verification block of M rows reads the
weight once; ``speedup_vs_F.linear`` is the ratio of medians in the same run.
"""
import pytest
import torch

import specops
from specops import backend as _backend

from _harness import main, pytest_benchmark

SHAPES = {"q_proj": (576, 576), "k_proj": (192, 576), "qkv": (960, 576), "gate_up": (3072, 576),
          "down_proj": (576, 1536), "lm_head": (49152, 576)}
ROWS = (1, 2, 4, 8, 16, 64)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
PROVIDERS = ("F.linear", "cpp", "triton", "cuda")


def cases(quick):
    if quick:
        return [dict(shape="qkv", M=M, dtype="bf16") for M in (1, 8)]
    out = [dict(shape=s, M=M, dtype="bf16") for s in SHAPES for M in ROWS]
    return out + [dict(shape=s, M=M, dtype="fp32") for s in ("qkv", "down_proj") for M in (1, 8)]


def inputs(shape, M, dtype, device):
    N, K = SHAPES[shape]
    g = torch.Generator().manual_seed(N + K)
    x = torch.randn(M, K, generator=g).to(DTYPES[dtype]).to(device)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DTYPES[dtype]).to(device)
    return x, w


def call(provider, x, w):
    if provider == "F.linear":
        return lambda: torch.nn.functional.linear(x, w)
    return lambda: specops.linear(x, w, backend=provider)


def measure(rec, quick):
    for params in cases(quick):
        x, w = inputs(**params, device=rec.device)
        M, (N, K) = params["M"], SHAPES[params["shape"]]
        nbytes = (N * K + M * K + M * N) * x.element_size()
        for provider in PROVIDERS:
            if provider != "F.linear":
                ok, why = _backend.available(provider, rec.device)
                if provider == "triton" and rec.device == "cpu":
                    ok, why = False, "interpreter only on CPU (not a timing)"
                if not ok:
                    rec.skip(provider, params, why)
                    continue
            rec.time(provider, params, call(provider, x, w), flop=2 * M * N * K, bytes=nbytes)
    rec.add_ratios("F.linear")


@pytest.mark.parametrize("params", cases(False), ids=lambda p: f"{p['shape']}-M{p['M']}-{p['dtype']}")
@pytest.mark.parametrize("provider", ["F.linear", "cpp"])
def test_linear(benchmark, provider, params):
    if provider != "F.linear" and not _backend.available(provider)[0]:
        pytest.skip(_backend.available(provider)[1])
    x, w = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, call(provider, x, w), provider=provider, **params)


if __name__ == "__main__":
    main("linear", measure)
