"""Verification ops against what peers do, with one read of the probability rows as the physical limit.

Cases: B in {1, 8, 64}, T in {8 (a chain, SD with gamma = 7), 64 (a tree: 4 children per
node, breadth first)}, V in {32000, 151936}, fp32. Drafts are realistic: the proposer at a node is
softmax(target logits of the node + noise), children are drawn from it, so acceptance is partial and
paths end early (what a verifier sees in practice).

Providers, all timed in the same run:
  torch_ref        the spec (specops torch backend): a Python walk per sequence
  vectorized       what EAGLE / Medusa do in torch: R1 = argmax of every row + path gathers over
                   precomputed root-to-leaf paths (Medusa's retrieve indices); R2 on chains = batched
                   gathers, cumprod and one multinomial (gpt-fast / HF style); R3 on trees = a loop over
                   depth and sibling slots with [B, V] residual updates (EAGLE's sampling verify, batched)
  hf               transformers' `_speculative_sampling` (R2, batch 1: looped over B), chains only
  cpp              specops cpp backend (check=False); triton / cuda when a GPU exists
  read_rows        torch.sum over the target (and draft) rows: one read of the probability rows
Derived: speedup_vs_torch_ref, speedup_vs_vectorized, speedup_vs_read_rows (> 0.5 = within 2x).

    python bench/bench_verify.py [--quick]       # CSV under bench/results/<machine>/
    pytest bench/bench_verify.py --benchmark-only

Sampled verification from logits (op verify_tree_logits, ``--logits``; CSV verify_logits.csv):
mode mss, V in {32000, 131072, 151936}, N = B * T in {16, 256, 1024} as chains (T 8) and trees
(T 16, 4 children per node), bf16 and fp32 logits, temperature 0.7 with top-p 0.9 or top-k 50.
Drafts are the target logits plus noise, tokens drawn from them.
  compose_<backend>  warp_probs of target and draft logits, then verify_tree (today's two passes)
  fused_<backend>    verify_tree_logits (same backend; bit-identical outputs)
Bytes per call (a model of what must move, not a measurement): the composition reads each logits
tensor, writes its fp32 probabilities and reads them back (2 * N * V * (e + 8)); the fused op reads
each logits row once at most (2 * N * V * e; the cpp kernel reads only the rows its walk reaches).
``model:H100`` / ``model:A100`` rows: those bytes over the datasheet HBM bandwidth (bench/roofline.py),
labelled as a model. Peak extra memory: the [N, V] fp32 tensors the composition allocates (measured
by the profiler) against the fused cpp kernel's scratch (its formula: the profiler does not see
C++ allocations). ``--logits --quick``: chains at V 32000 / 131072 and N 16 / 256, the tree at the
target case, and N 1024 at V 131072 bf16 top-p.

    python bench/bench_verify.py --logits [--quick]
"""
import sys

import pytest
import torch

import specops
from specops import backend as _backend

from _harness import main, pytest_benchmark

OPS = ["greedy", "mss", "mss_pointmass", "mss_noreplace", "sample_match", "gsd", "joint"]
CASES = [dict(op=op, B=B, T=T, V=V) for V in (32000, 151936) for T in (8, 64) for B in (1, 8, 64) for op in OPS]
QUICK = [dict(op=op, B=B, T=T, V=1000) for T in (8, 64) for B in (1, 8) for op in OPS]
CHILDREN = 4


def tree_parents(T, chain):
    """Chain, or a breadth-first tree with CHILDREN children per node. Shape: -> int32 [T]."""
    i = torch.arange(T)
    return (i - 1 if chain else (i - 1).div(CHILDREN, rounding_mode="floor")).to(torch.int32)


def inputs(op, B, T, V, device, noise=1.0):
    """Built one sequence at a time and only what `op` reads, so B = 64, V = 151936 fits in memory."""
    g = torch.Generator().manual_seed(B * 1000 + T * 10 + V % 997)
    parents = tree_parents(T, T <= 8).expand(B, T).contiguous()
    par = parents[0].long().clamp(min=0)
    tokens = torch.empty(B, T, dtype=torch.int32)
    rows = torch.empty(B, T, V)  # logits (greedy), log-probs (joint) or target probs
    draft = torch.empty(B, T, V) if op not in ("greedy", "joint") else None
    joint_q = torch.empty(B, T - 1)
    for b in range(B):
        logits = torch.randn(T, V, generator=g) * 4
        # draft row of node c = the proposer at its parent: the parent's target logits + noise
        q = (logits[par] + noise * torch.randn(T, V, generator=g)).softmax(-1)
        tokens[b] = torch.multinomial(q, 1, generator=g)[:, 0].to(torch.int32)
        joint_q[b] = torch.cumsum(torch.log(q[1:].gather(1, tokens[b, 1:].long()[:, None])[:, 0]), 0)
        rows[b] = logits if op == "greedy" else (logits.log_softmax(-1) if op == "joint" else logits.softmax(-1))
        if draft is not None:
            draft[b] = q
    case = dict(tokens=tokens, parents=parents, num_nodes=torch.full((B,), T, dtype=torch.int32),
                uniforms=torch.rand(B, T, 2, generator=g))
    if op == "greedy":
        case["logits"] = rows
    elif op == "joint":  # the chain's T - 1 drafts, T target rows, the drafts' joint log-probabilities
        case.update(draft_tokens=tokens[:, 1:].contiguous(), logprobs=rows, joint_q=joint_q)
    else:
        case.update(probs=rows, draft=draft)
    return {k: v.to(device) for k, v in case.items()}


def root_paths(parents):
    """Medusa's retrieve indices: every root-to-leaf path, padded with -1. Shape: [T] -> [L, D]."""
    T = parents.shape[0]
    is_parent = torch.zeros(T, dtype=torch.bool)
    is_parent[parents[1:].long()] = True
    paths = []
    for leaf in (~is_parent).nonzero().flatten().tolist():
        path = [leaf]
        while path[-1] != 0:
            path.append(int(parents[path[-1]]))
        paths.append(path[::-1])
    depth = max(len(p) for p in paths)
    return torch.tensor([p + [-1] * (depth - len(p)) for p in paths])


def greedy_vectorized(tokens, logits, paths):
    """Medusa / EAGLE: argmax of every row, then the longest matching candidate path."""
    pred = logits.argmax(-1)  # [B, T]
    B = tokens.shape[0]
    safe = paths.clamp(min=0)
    cand = tokens.long()[:, safe[:, 1:]]  # [B, L, D-1]
    want = pred[:, safe[:, :-1]]
    ok = (cand == want) & (paths[:, 1:] >= 0)
    lens = ok.int().cumprod(-1).sum(-1)  # [B, L]
    best = lens.argmax(-1)
    n = lens.gather(1, best[:, None])[:, 0]
    path = safe[best]  # [B, D]
    end = path.gather(1, n[:, None])[:, 0]
    return path, n + 1, pred.gather(1, end[:, None])[:, 0]


def chain_vectorized(tokens, P, Q, U):
    """Batched R2 (gpt-fast / HF style) on chains."""
    B, T, V = P.shape
    x = tokens.long()[:, 1:]
    p = P[:, :-1].gather(2, x[:, :, None])[:, :, 0]
    q = Q[:, 1:].gather(2, x[:, :, None])[:, :, 0]
    accept = U[:, 1:, 0] * q < p
    n = accept.int().cumprod(1).sum(1)  # accepted drafts
    rows = torch.arange(B, device=P.device)
    pn = P[rows, n]
    qn = Q[rows, (n + 1).clamp(max=T - 1)]
    res = (pn - qn).clamp(min=0)
    res = torch.where((n < T - 1)[:, None], res / res.sum(-1, keepdim=True).clamp(min=1e-30), pn)
    return n + 1, torch.multinomial(res, 1)[:, 0]


def mss_vectorized(tokens, kids, P, Q, U):
    """EAGLE's sampling verify batched over B: loops over depth and sibling slots, children tried in
    index order, [B, V] residual updates. kids: [T, K] child table, -1 padded."""
    B, T, V = P.shape
    rows = torch.arange(B, device=P.device)
    cur = torch.zeros(B, dtype=torch.long, device=P.device)
    live = torch.ones(B, dtype=torch.bool, device=P.device)
    bonus = torch.zeros(B, dtype=torch.long, device=P.device)
    lens = torch.ones(B, dtype=torch.long, device=P.device)
    R = P[rows, cur]
    while bool(live.any()):
        nxt = torch.full_like(cur, -1)
        for k in range(kids.shape[1]):
            c = kids[cur, k]
            try_ = live & (c >= 0) & (nxt < 0)
            if not bool(try_.any()):
                break
            cc = c.clamp(min=0)
            x = tokens.long()[rows, cc]
            q = Q[rows, cc]
            px = R.gather(1, x[:, None])[:, 0]
            qx = q.gather(1, x[:, None])[:, 0]
            acc = try_ & (U[rows, cc, 0] * qx < px)
            rej = try_ & ~acc
            res = (R - q).clamp(min=0)
            res = res / res.sum(-1, keepdim=True).clamp(min=1e-30)
            R = torch.where(rej[:, None], res, R)
            nxt = torch.where(acc, cc, nxt)
        done = live & (nxt < 0)
        if bool(done.any()):
            bonus = torch.where(done, torch.multinomial(R, 1)[:, 0], bonus)
        live = live & ~done
        cur = torch.where(live, nxt, cur)
        lens = lens + live.long()
        R = torch.where(live[:, None], P[rows, cur], R)
    return lens, bonus


def hf_chain(tokens, P, Q):
    """transformers' _speculative_sampling (batch 1), looped over the batch."""
    import inspect

    from transformers.generation.utils import _speculative_sampling

    # transformers up to 5.17 (a GPU image's) also takes is_done_candidate; the pinned releases do not
    extra = [False] if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters else []
    out = []
    gamma = P.shape[1] - 1
    for b in range(P.shape[0]):
        cand = tokens[b: b + 1].long()
        out.append(_speculative_sampling(cand, Q[b: b + 1, 1:].log(), gamma, P[b: b + 1].log(), *extra))
    return out


def child_table(parents):
    T = parents.shape[0]
    kids = [[c for c in range(1, T) if int(parents[c]) == u] for u in range(T)]
    K = max(1, max(len(k) for k in kids))
    return torch.tensor([k + [-1] * (K - len(k)) for k in kids])


def provider_fn(name, op, c):
    backend = {"torch_ref": "torch", "cpp": "cpp", "triton": "triton", "cuda": "cuda"}.get(name)
    if backend:
        if op == "greedy":
            return lambda: specops.verify_greedy(c["tokens"], c["parents"], c["logits"], c["num_nodes"], check=False,
                                                 backend=backend)
        if op == "joint":
            return lambda: specops.verify_joint(c["draft_tokens"], c["logprobs"], c["joint_q"], 0.3,
                                                c["uniforms"][:, 0, 0].contiguous(), check=False, backend=backend)
        return lambda: specops.verify_tree(c["tokens"], c["parents"], c["probs"], c["uniforms"], draft_probs=c["draft"],
                                           mode=op, num_nodes=c["num_nodes"], check=False, backend=backend)
    if name == "vectorized":
        chain = bool((c["parents"][0, 1:].cpu() == torch.arange(c["parents"].shape[1] - 1)).all())
        if op == "greedy":
            paths = root_paths(c["parents"][0].cpu()).to(c["tokens"].device)
            return lambda: greedy_vectorized(c["tokens"], c["logits"], paths)
        if op == "mss" and chain:
            return lambda: chain_vectorized(c["tokens"], c["probs"], c["draft"], c["uniforms"])
        if op == "mss":
            kids = child_table(c["parents"][0].cpu()).to(c["tokens"].device)
            return lambda: mss_vectorized(c["tokens"], kids, c["probs"], c["draft"], c["uniforms"])
        return None
    if name == "hf":
        chain = bool((c["parents"][0, 1:].cpu() == torch.arange(c["parents"].shape[1] - 1)).all())
        return (lambda: hf_chain(c["tokens"], c["probs"], c["draft"])) if op == "mss" and chain else None
    if name == "read_rows":
        if op == "greedy":
            return lambda: c["logits"].sum()
        if op == "joint":
            return lambda: c["logprobs"].sum()
        return lambda: (c["probs"].sum(), c["draft"].sum())
    raise ValueError(name)


def row_bytes(op, c):
    if op == "greedy":
        return c["logits"].numel() * 4
    if op == "joint":
        return c["logprobs"].numel() * 4
    return (c["probs"].numel() + c["draft"].numel()) * 4


PROVIDERS = ["read_rows", "torch_ref", "vectorized", "hf", "cpp", "triton", "cuda"]


def measure(rec, quick):
    for params in QUICK if quick else CASES:
        c = inputs(**params, device=rec.device)
        for name in PROVIDERS:
            if name in ("cpp", "triton", "cuda"):
                ok, why = _backend.available(name, rec.device)
                if name == "triton" and torch.device(rec.device).type == "cpu":
                    ok, why = False, "interpreter only on CPU (not a timing)"
                if not ok:
                    rec.skip(name, params, why)
                    continue
            fn = provider_fn(name, params["op"], c)
            if fn is None:
                continue
            slow = name in ("torch_ref", "hf")
            rec.time(name, params, fn, bytes=row_bytes(params["op"], c),
                     **({"min_repeats": 2, "budget_s": 0.2, "warmup": 1} if slow else {}))
        del c
    for base in ("torch_ref", "vectorized", "read_rows"):
        rec.add_ratios(base)


@pytest.mark.parametrize("params", [p for p in QUICK if p["B"] == 8], ids=lambda p: f"{p['op']}-T{p['T']}")
@pytest.mark.parametrize("provider", ["torch_ref", "cpp"])
def test_verify(benchmark, provider, params):
    if provider == "cpp" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    fn = provider_fn(provider, params["op"], inputs(**params, device="cpu"))
    pytest_benchmark(benchmark, fn, provider=provider, **params)


# ---- verify_tree_logits against warp_probs + verify_tree ------------------------------------------

LOGIT_CASES = [dict(V=V, N=N, shape=shape, dtype=dt, warp=w) for V in (32000, 131072, 151936)
               for N in (16, 256, 1024) for shape in ("chain", "tree") for dt in ("bf16", "fp32")
               for w in ("top_p=0.9", "top_k=50")]
LOGIT_QUICK = ([c for c in LOGIT_CASES if c["V"] in (32000, 131072) and c["N"] in (16, 256) and c["shape"] == "chain"]
               + [dict(V=131072, N=256, shape="tree", dtype="bf16", warp="top_p=0.9"),
                  dict(V=131072, N=1024, shape="chain", dtype="bf16", warp="top_p=0.9")])
WARPS = {"top_p=0.9": dict(temperature=0.7, top_k=0, top_p=0.9), "top_k=50": dict(temperature=0.7, top_k=50, top_p=1.0)}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def logit_inputs(V, N, shape, dtype, warp, device, noise=1.0):
    """Built one sequence at a time (only the logits are kept). Shape: logits [B, T, V]."""
    T = 8 if shape == "chain" else 16
    B = max(1, N // T)
    g = torch.Generator().manual_seed(V % 997 + N + T)
    parents = tree_parents(T, shape == "chain").expand(B, T).contiguous()
    par = parents[0].long().clamp(min=0)
    X = torch.empty(B, T, V, dtype=DTYPES[dtype])
    Y = torch.empty(B, T, V, dtype=DTYPES[dtype])
    tokens = torch.empty(B, T, dtype=torch.int32)
    for b in range(B):
        x = torch.randn(T, V, generator=g) * 4
        y = x[par] + noise * torch.randn(T, V, generator=g)  # draft row c = the proposer at parents[c]
        tokens[b] = torch.multinomial((y / 0.7).softmax(-1), 1, generator=g)[:, 0].to(torch.int32)
        X[b], Y[b] = x, y
    case = dict(tokens=tokens, parents=parents, num_nodes=torch.full((B,), T, dtype=torch.int32),
                uniforms=torch.rand(B, T, 2, generator=g), X=X, Y=Y)
    return {k: v.to(device) for k, v in case.items()}


def logits_fn(kind, backend, c, warp):
    w = WARPS[warp]
    if kind == "fused":
        return lambda: specops.verify_tree_logits(
            c["tokens"], c["parents"], c["X"], c["uniforms"], **w, draft_logits=c["Y"], draft_top_k=w["top_k"],
            draft_top_p=w["top_p"], mode="mss",
            num_nodes=c["num_nodes"], check=False, backend=backend)
    B, T, V = c["X"].shape

    def compose():
        P = specops.warp_probs(c["X"].view(B * T, V), w["temperature"], w["top_k"], w["top_p"], check=False,
                               backend=backend).view(B, T, V)
        Q = specops.warp_probs(c["Y"].view(B * T, V), w["temperature"], w["top_k"], w["top_p"], check=False,
                               backend=backend).view(B, T, V)
        return specops.verify_tree(c["tokens"], c["parents"], P, c["uniforms"], draft_probs=Q, mode="mss",
                                   num_nodes=c["num_nodes"], check=False, backend=backend)
    return compose


def fused_cpp_scratch_bytes(B, T, V):
    """The cpp kernel's scratch per call (csrc/cpu/verify_logits.cpp): per thread two warped-row
    slots, mss's two residual rows, warp_probs' z row, the chunk sums and the [2, T] row statistics;
    not counted: the top-p candidates' keys, indices and masses (16 B per candidate, sized to the
    row's candidates: the tokens whose mass can matter, far fewer than V on peaked rows)."""
    rows = 2 + 2 + 1  # slots, residual double buffer, z
    threads = min(torch.get_num_threads(), B)
    return threads * (rows * 4 * V + 4 * 8 * ((V + 2047) // 2048) + 2 * T * 24)


def measure_logits(rec, quick):
    from roofline import GPUS

    for params in LOGIT_QUICK if quick else LOGIT_CASES:
        c = logit_inputs(**params, device=rec.device)
        B, T, V = c["X"].shape
        e = c["X"].element_size()
        nbytes = {"compose": 2 * B * T * V * (e + 8), "fused": 2 * B * T * V * e}
        for backend in ("cpp", "cuda", "triton"):
            ok, why = _backend.available(backend, rec.device)
            if backend == "triton" and torch.device(rec.device).type == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            if not ok:
                continue
            for kind in ("compose", "fused"):
                rec.time(f"{kind}_{backend}", params, logits_fn(kind, backend, c, params["warp"]), bytes=nbytes[kind],
                         memory=kind == "compose" and params["N"] == 1024,
                         **({"min_repeats": 3, "budget_s": 0.5} if params["N"] >= 256 else {}))
        if _backend.available("cpp", rec.device)[0]:
            rec.value("fused_cpp", params, "peak_extra_memory_model", "bytes", fused_cpp_scratch_bytes(B, T, V))
        for gpu, (bandwidth, _, _) in GPUS.items():
            for kind in ("compose", "fused"):
                rec.value(f"model:{gpu}:{kind}", params, "lower_bound", "ms (memory-bound, model)",
                          nbytes[kind] / (bandwidth * 1e9) * 1e3)
        del c
    for backend in ("cpp", "cuda", "triton"):
        rec.add_ratios(f"compose_{backend}", over=(f"fused_{backend}",))


if __name__ == "__main__":
    if "--logits" in sys.argv:
        sys.argv.remove("--logits")
        main("verify_logits", measure_logits)
    else:
        main("verify", measure)
