"""specops.linear against torch's F.linear on SmolLM2-135M's projections, M = 1 to 64 rows.

    python bench/bench_linear.py [--quick] [--providers F.linear,cpp]   # CSV under bench/results/<machine>/
    pytest bench/bench_linear.py --benchmark-only

The shapes are the model's: q/o 576x576, k/v 192x576, fused qkv 960x576, gate/up 1536x576 (fused
3072x576), down 576x1536 and the tied LM head 49152x576; ``step`` is a decoding step's 210
projections (30 distinct layers, so the weights stream from memory as in a model) with the packed
copies the engine makes. A verification block of M rows reads the weight once; ``speedup_vs_F.linear``
is the ratio of medians in the same run. ``cpp_lanes`` is the cpp kernel kept on the lane order
(``SPECOPS_CPU_ISA=avx512``): on a CPU with AMX, ``cpp`` runs bf16 on the AMX tiles
(docs/batch_invariance.md, AMX tiles).
"""
import os

import pytest
import torch

import specops
from specops import backend as _backend
from specops.ops.linear import LAYOUTS, machine_layout, pack_weight

from _harness import main, pytest_benchmark

SHAPES = {"q_proj": (576, 576), "k_proj": (192, 576), "qkv": (960, 576), "gate_up": (3072, 576),
          "down_proj": (576, 1536), "lm_head": (49152, 576)}
ROWS = (1, 2, 4, 8, 16, 64)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
PROVIDERS = ("F.linear", "cpp", "cpp_lanes", "triton", "cuda")
LAYER = ("q_proj", "k_proj", "k_proj", "q_proj", "gate_up", "down_proj")  # k, v; gate/up fused, as the engine runs


def cases(quick):
    if quick:
        return [dict(shape="qkv", M=M, dtype="bf16") for M in (1, 8)]
    out = [dict(shape=s, M=M, dtype="bf16") for s in (*SHAPES, "step") for M in ROWS]
    return out + [dict(shape=s, M=M, dtype="fp32") for s in ("qkv", "down_proj") for M in (1, 8)]


def inputs(shape, M, dtype, device):
    """x [M, K] and weight [N, K]; ``step``: {K: x}, and 30 layers of (weight, {layout: packed copy})."""
    if shape == "step":
        xs = {K: inputs("q_proj" if K == 576 else "down_proj", M, dtype, device)[0] for K in (576, 1536)}
        pack = DTYPES[dtype] == torch.bfloat16 and device == "cpu"
        layers = [[(w, {lay: pack_weight(w, lay) for lay in LAYOUTS} if pack else {})
                   for w in (inputs(s, 1, dtype, device)[1] for s in LAYER)] for _ in range(30)]
        return xs, layers
    N, K = SHAPES[shape]
    g = torch.Generator().manual_seed(N + K)
    x = torch.randn(M, K, generator=g).to(DTYPES[dtype]).to(device)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DTYPES[dtype]).to(device)
    return x, w


def call(provider, x, w):
    backend = "cpp" if provider == "cpp_lanes" else provider
    if isinstance(w, list):  # the step: every layer's projections, F.linear reading the plain weights
        layout = "avx512" if provider == "cpp_lanes" else machine_layout()

        def one(a, wt, packed):
            if provider == "F.linear":
                return torch.nn.functional.linear(a, wt)
            return specops.linear(a, wt, packed=packed.get(layout), backend=backend)
        fn = lambda: [one(x[wt.shape[1]], wt, p) for layer in w for wt, p in layer]
    elif provider == "F.linear":
        return lambda: torch.nn.functional.linear(x, w)
    else:
        fn = lambda: specops.linear(x, w, backend=backend)
    if provider != "cpp_lanes":
        return fn

    def lanes():
        old = os.environ.get("SPECOPS_CPU_ISA")
        os.environ["SPECOPS_CPU_ISA"] = "avx512"
        try:
            return fn()
        finally:
            os.environ.pop("SPECOPS_CPU_ISA") if old is None else os.environ.__setitem__("SPECOPS_CPU_ISA", old)
    return lanes


def measure(rec, quick):
    for params in cases(quick):
        x, w = inputs(**params, device=rec.device)
        M = params["M"]
        shapes = [SHAPES[s] for s in LAYER] * 30 if params["shape"] == "step" else [SHAPES[params["shape"]]]
        nbytes = sum(N * K + M * K + M * N for N, K in shapes) * DTYPES[params["dtype"]].itemsize
        for provider in PROVIDERS:
            if provider == "cpp_lanes" and (rec.device != "cpu" or params["dtype"] != "bf16"):
                continue  # the AMX tiles take bf16 on the CPU only: elsewhere cpp is the lane order
            if provider != "F.linear":
                ok, why = _backend.available("cpp" if provider == "cpp_lanes" else provider, rec.device)
                if provider == "triton" and rec.device == "cpu":
                    ok, why = False, "interpreter only on CPU (not a timing)"
                if not ok:
                    rec.skip(provider, params, why)
                    continue
            rec.time(provider, params, call(provider, x, w), flop=sum(2 * M * N * K for N, K in shapes), bytes=nbytes)
    rec.add_ratios("F.linear")


@pytest.mark.parametrize("params", cases(False), ids=lambda p: f"{p['shape']}-M{p['M']}-{p['dtype']}")
@pytest.mark.parametrize("provider", ["F.linear", "cpp", "cpp_lanes"])
def test_linear(benchmark, provider, params):
    if provider != "F.linear" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    x, w = inputs(**params, device="cpu")
    pytest_benchmark(benchmark, call(provider, x, w), provider=provider, **params)


if __name__ == "__main__":
    main("linear", measure)
