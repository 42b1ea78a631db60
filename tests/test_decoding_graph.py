"""The verification-to-keep part of a decode step as one graph (``keep_accepted``: ``verify.verify_kept``
-> lengths masked by the device active mask -> the kv_compact of ``StaticKVCache.compact``, as
``Decoder.step`` runs it): it compiles with ``torch.compile(fullgraph=True)`` on the CPU (no host read,
no host data) and replays in a CUDA graph with new inputs on a GPU (skipped without one)."""
import pytest
import torch

import specops
from specops.decoding import verify as verify_mod
from specops.testing import random_verify_case

pytestmark = pytest.mark.usefixtures("one_thread")

L, B, H, S, D, T, V = 2, 3, 2, 24, 8, 5, 16


def keep_accepted(tokens, parents, num_nodes, logits, uniforms, active, k_cache, v_cache, lens):
    """Shape: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B], logits [B, T, V],
    uniforms fp32 [B, T, 2] or None (greedy), active bool [B], caches [L, B, H, S, D], lens int32 [B]
    -> (new lens int32 [B], bonus [B], accept_idx int32 [B, T], kept int32 [B])."""
    idx, kept, bonus = verify_mod.verify_kept(tokens, parents, num_nodes, logits, uniforms, active)
    specops.kv_compact(k_cache, v_cache, lens, idx, kept, check=False)
    return lens + kept, bonus, idx, kept


def inputs(seed, device="cpu", sampled=False):
    g = torch.Generator().manual_seed(seed)
    # peaked target rows and children that are often their parent's argmax: paths get accepted
    c = random_verify_case(B, T, V, generator=g, sharpness=4.0)
    active = torch.tensor([True, False, True])
    k, v = (torch.randn(L, B, H, S, D, generator=g) for _ in range(2))
    lens = torch.randint(0, S - T, (B,), generator=g, dtype=torch.int32)
    uniforms = c["uniforms"] if sampled else None
    out = (c["tokens"].long(), c["parents"], c["num_nodes"], c["target_logits"], uniforms, active, k, v, lens)
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in out)


def clone(args):
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_verify_to_keep_compiles_fullgraph_on_cpu(sampled):
    torch._dynamo.reset()
    compiled = torch.compile(keep_accepted, fullgraph=True, backend="aot_eager")
    for seed in (0, 1):
        args = inputs(seed, sampled=sampled)
        want_args, got_args = clone(args), clone(args)
        want, got = keep_accepted(*want_args), compiled(*got_args)
        assert all(map(torch.equal, want, got))
        assert torch.equal(want_args[6], got_args[6]) and torch.equal(want_args[7], got_args[7])  # caches
        assert int(want[3][1]) == 0  # the finished sequence keeps nothing
        assert int(want[3].max()) >= 2  # some path longer than the root was kept


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_verify_to_keep_replays_in_a_cuda_graph(sampled):
    static = clone(inputs(0, "cuda", sampled))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture (lazy inits, backend choice)
        keep_accepted(*clone(static))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = keep_accepted(*static)
    for seed in (1, 2, 3):
        fresh = inputs(seed, "cuda", sampled)
        for dst, src in zip(static, fresh):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        ref_args = clone(fresh)
        want = keep_accepted(*ref_args)
        graph.replay()
        torch.cuda.synchronize()
        assert all(map(torch.equal, want, out)), seed
        assert torch.equal(ref_args[6], static[6]) and torch.equal(ref_args[7], static[7])
