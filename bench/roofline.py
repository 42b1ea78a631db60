"""A roofline model of tree_attention on reference GPUs: the lower bound a kernel cannot beat.

A model, never a measurement: bytes that must cross HBM at least once and the dense FLOPs, each over
the datasheet peak of an H100 SXM and an A100 SXM (80 GB); the bound is the larger of the two times.
The benchmark records it as provider ``model:H100`` / ``model:A100`` (metric ``lower_bound``) beside
every case, and prints it beside GPU timings when there are any; the README names it a model.

Bytes: K and V of every (sequence, kv head) read once, ``prefix + tree`` rows of ``D`` elements each
(a kernel that re-reads K/V per GQA head or per query tile pays more), plus q and the output, plus the
mask words. FLOPs: ``4 * B * Hq * Tq * (prefix + tree) * D`` (QK^T and PV, dense: the tree mask
saves nothing that a tile-based kernel skips at these sizes). Tensor-core peaks for fp16/bf16,
CUDA-core fp32 peaks for fp32 (the kernels do not use TF32).
"""

GPUS = {
    # name: (HBM GB/s, fp16/bf16 dense tensor TFLOP/s, fp32 TFLOP/s), datasheet figures
    "H100": (3350.0, 989.0, 67.0),
    "A100": (2039.0, 312.0, 19.5),
}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def tree_attention_work(Hq, Hkv, D, prefix, tree, B, dtype, **_):
    """(bytes, flops) of one tree_attention call; Tq = tree queries, S = prefix + tree keys."""
    e = ELEMENT_BYTES[dtype]
    S = prefix + tree
    kv = 2 * B * Hkv * S * D * e
    q_out = 2 * B * tree * Hq * D * e
    mask = B * tree * ((tree + 31) // 32) * 4
    flops = 4 * B * Hq * tree * S * D
    return kv + q_out + mask, flops


def lower_bound_ms(gpu, params):
    """The model's lower bound in ms on ``gpu`` and which resource sets it ("memory" / "compute")."""
    bandwidth, tensor, fp32 = GPUS[gpu]
    nbytes, flops = tree_attention_work(**params)
    peak = fp32 if params["dtype"] == "fp32" else tensor
    t_mem = nbytes / (bandwidth * 1e9) * 1e3
    t_flop = flops / (peak * 1e12) * 1e3
    return (t_mem, "memory") if t_mem >= t_flop else (t_flop, "compute")


def record(rec, params):
    """Adds the model's bound for each GPU to the recorder as a provider ``model:<gpu>``."""
    for gpu in GPUS:
        t, bound = lower_bound_ms(gpu, params)
        rec.value(f"model:{gpu}", params, "lower_bound", f"ms ({bound}-bound, model)", t)
