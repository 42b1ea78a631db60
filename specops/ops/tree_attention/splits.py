"""The split schedule of tree_attention: how many kv splits (flash-decoding) a call's launches use,
one rule per device kind (docs/plans.md, "The split schedule"); the kernels take the count and never
decide. Nothing here imports the rest of specops: the kernels' modules import it."""
MAX_SPLITS = 64  # csrc/tree_attention_common.h kMaxSplits; the combine's partials per row

# The CPU kernel's geometry (csrc/cpu/tree_attention.cpp): keys per K/V tile, query rows per item.
CPU_TILE_KEYS = 96
CPU_MAX_ROWS = 192

SMS = {90: 132, 80: 108}  # H100 SXM / A100 SXM, for planning without a device (AOT, report)
# Peak tensor-core (fp16/bf16) or CUDA-core (fp32) flop/s over DRAM byte/s of the H100 SXM and
# A100 SXM datasheets: how many flops one byte of traffic is worth in the cost model.
BALANCE = {(90, False): 989e12 / 3.35e12, (90, True): 67e12 / 3.35e12,
           (80, False): 312e12 / 2.04e12, (80, True): 19.5e12 / 2.04e12}
# (arch, SMs) of GPU kernels on CPU tensors (cudasim, Triton interpreter): few, so that small decodes split
SIM_TARGET = (90, 8)


def cpu_splits(B, Tq, Hq, Hkv, D, max_tiles, threads):
    """KV splits of the CPU kernel (1: no split); ``max_tiles``: the most K/V tiles a sequence takes.
    Each worker should get a few tens of microseconds (or fork/join costs more than it saves): the flops
    cap the threads in use; the (sequence, kv head, query tile) items are split along the keys only when
    they do not already keep those threads busy (a multiple of them, or >= 8 items a thread)."""
    G = max(1, Hq // max(Hkv, 1))
    n_qtiles = -(-Tq // max(1, CPU_MAX_ROWS // G))
    flop = 4.0 * B * Hq * Tq * max_tiles * CPU_TILE_KEYS * D
    threads = max(1, min(threads, int(flop / 4e6 + 1)))
    items = B * Hkv * n_qtiles
    if threads <= 1 or items == 0 or items % threads == 0 or items >= 8 * threads:
        return 1
    ns = 2
    while (items * ns) % threads and items * ns < 8 * threads:
        ns += 1
    return max(1, min(ns, max_tiles // 2, MAX_SPLITS))


def gpu_splits(n_programs, sms, kv_bytes, part_bytes, flops, balance, n_tiles):
    """KV splits for a launch of ``n_programs`` programs on ``sms`` SMs (1: no split). Cost model, in
    bytes at full device rate: ``kv_bytes`` of K/V streamed (an upper bound: the cache length, not the
    lengths, which would need a host sync), ``flops`` worth ``flops / balance`` bytes, ``part_bytes`` of
    partials each split writes and the combine reads back; only ``n_programs * ns`` SMs work when that
    is below ``sms``. A split must halve the cost to be taken (the combine launch is not in the model)."""
    def cost(ns):
        traffic = kv_bytes + (2 * ns * part_bytes if ns > 1 else 0)
        return max(traffic, flops / balance) / min(1.0, n_programs * ns / sms)

    best = min(range(1, min(MAX_SPLITS, max(1, n_tiles)) + 1), key=cost)  # the first of the cheapest
    return best if 2 * cost(best) <= cost(1) else 1


def gpu_launch_splits(B, Tq, Hq, Hkv, D, S, element_size, fp32, rows_per_program, keys_per_tile, arch, sms):
    """:func:`gpu_splits` for one tree_attention launch: programs own ``rows_per_program`` query
    rows of one (sequence, kv head) and walk ``S`` keys in tiles of ``keys_per_tile``."""
    R = B * Tq * Hq
    n_programs = -(-(Tq * (Hq // Hkv)) // rows_per_program) * B * Hkv
    if n_programs == 0 or D == 0:
        return 1  # nothing launches
    return gpu_splits(n_programs, sms, kv_bytes=2 * B * Hkv * S * D * element_size, part_bytes=R * (D + 1) * 4,
                      flops=4 * R * S * D, balance=BALANCE[arch, fp32], n_tiles=-(-S // keys_per_tile))


def workspace_size(num_splits, B, Tq, Hq, D):
    """fp32 elements of the partials: part_o [ns, B * Tq * Hq, D], then part_lse [ns, B * Tq * Hq]."""
    return 0 if num_splits <= 1 else num_splits * B * Tq * Hq * (D + 1)
