"""The ops the loop calls, resolved from ``specops`` (the kernels) with plain-torch stand-ins.

The loop is written against the public ops of issue 4 (``warp_probs``, ``verify_greedy``,
``verify_tree``, ```verify_joint``, ``topn_expand``, ``select_topn_subtree``). While a kernel family has not landed in this
checkout, the stand-in below (a direct transcription of methods.md section 1) keeps the loop
usable; once ``specops.<op>`` exists it is used. The stand-ins follow the same contract
(shapes, padding with -1, randomness only from ``uniforms``).
"""
import torch

import specops

_FORCE_FALLBACK = False  # tests flip this to compare the kernels against the stand-ins


def op(name):
    fn = None if _FORCE_FALLBACK else getattr(specops, name, None)
    return fn if fn is not None else globals()["_" + name]


def kernel_names():
    """Which loop ops come from specops kernels here (the rest use the stand-ins)."""
    names = ("warp_probs", "verify_greedy", "verify_tree", "verify_joint", "topn_expand", "select_topn_subtree")
    return {n: getattr(specops, n, None) is not None for n in names}


# ---- stand-ins -------------------------------------------------------------------------------

def _warp_probs(logits, temperature, top_k=0, top_p=1.0):
    # Shape: logits [N, V] -> probs fp32 [N, V]; scalar parameters only (what the loop passes).
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    x = logits / temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = x.softmax(-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _children(parents_row, n):
    kids = [[] for _ in range(n)]
    for i in range(1, n):
        kids[int(parents_row[i])].append(i)
    return kids


def _sample(probs, u):
    # Inverse CDF with a supplied uniform; never returns a zero-probability token.
    cdf = probs.cumsum(0)
    idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype)).item())
    idx = min(idx, probs.numel() - 1)
    while probs[idx] <= 0 and idx > 0:
        idx -= 1
    while probs[idx] <= 0 and idx < probs.numel() - 1:
        idx += 1
    return idx


def _residual(p, q):
    r = (p - q).clamp(min=0)
    s = float(r.sum())
    return p if s < 1e-12 else r / s


def _finish(paths, bonus, B, T, device):
    accept_idx = torch.full((B, T), -1, dtype=torch.int32)
    for b, path in enumerate(paths):
        accept_idx[b, : len(path)] = torch.tensor(path, dtype=torch.int32)
    lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    return accept_idx.to(device), lens.to(device), torch.tensor(bonus, dtype=torch.int32, device=device)


def _verify_greedy(tokens, parents, target_logits, num_nodes=None):
    B, T = tokens.shape
    n = [T] * B if num_nodes is None else num_nodes.tolist()
    arg = target_logits.argmax(-1).tolist()
    tok = tokens.tolist()
    paths, bonus = [], []
    for b in range(B):
        kids = _children(parents[b].tolist(), n[b])
        u, path = 0, [0]
        while True:
            nxt = next((c for c in kids[u] if tok[b][c] == arg[b][u]), None)
            if nxt is None:
                break
            u = nxt
            path.append(u)
        paths.append(path)
        bonus.append(arg[b][u])
    return _finish(paths, bonus, B, T, tokens.device)


def _verify_tree(tokens, parents, target_probs, uniforms, *, draft_probs=None, mode, num_nodes=None):
    B, T = tokens.shape
    n = [T] * B if num_nodes is None else num_nodes.tolist()
    tok = tokens.tolist()
    U = uniforms.tolist()
    paths, bonus = [], []
    for b in range(B):
        kids = _children(parents[b].tolist(), n[b])
        P = target_probs[b].float()
        if mode == "gsd":
            path = _gsd_path(kids, tok[b], P, draft_probs[b].float(), U[b])
            u = path[-1]
            paths.append(path)
            bonus.append(_sample(P[u], U[b][u][1]))
            continue
        u, path = 0, [0]
        while True:
            p_res = P[u].clone()
            if mode == "sample_match":
                v = _sample(p_res, U[b][u][1])
                nxt = next((c for c in kids[u] if tok[b][c] == v), None)
                if nxt is None:
                    bonus.append(v)
                    break
                u = nxt
                path.append(u)
                continue
            q_res = None
            accepted = None
            for c in kids[u]:
                x = tok[b][c]
                r = U[b][c][0]
                if mode == "mss_pointmass":
                    if r < float(p_res[x]):
                        accepted = c
                        break
                    p_res = _residual(p_res, torch.nn.functional.one_hot(torch.tensor(x), P.shape[-1]).float())
                    continue
                q = draft_probs[b, c].float()
                if mode == "mss_noreplace":
                    q_res = q.clone() if q_res is None else q_res
                    q = q_res
                qx = float(q[x])
                if qx <= 0 or r * qx < float(p_res[x]):
                    if qx > 0 or float(p_res[x]) > 0:
                        accepted = c
                        break
                p_res = _residual(p_res, q)
                if mode == "mss_noreplace":
                    q_res = q_res.clone()
                    q_res[x] = 0
                    s = float(q_res.sum())
                    q_res = q_res / s if s > 1e-12 else q_res
            if accepted is None:
                bonus.append(_sample(p_res, U[b][u][1]))
                break
            u = accepted
            path.append(u)
        paths.append(path)
    return _finish(paths, bonus, B, T, tokens.device)


def _gsd_path(kids, tok, P, Q, U):
    # R5: every edge passes on its own coin; the longest all-passing root path wins (first found).
    best = [0]
    stack = [[0]]
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        u = path[-1]
        for c in reversed(kids[u]):
            x = tok[c]
            qx = float(Q[c, x])
            ratio = 1.0 if qx <= 0 else min(1.0, float(P[u, x]) / qx)
            if U[c][0] < ratio:
                stack.append(path + [c])
    return best


def _verify_joint(draft_tokens, target_logprobs, draft_joint_logprobs, tau, uniforms):
    # R6: the longest prefix whose joint ratio passes tau; bonus from the next position.
    # Shape: -> accept_idx int32 [B, g + 1], accept_lens int32 [B], bonus int32 [B].
    B, g = draft_tokens.shape
    lp = target_logprobs.float().gather(-1, draft_tokens.long()[..., None])[..., 0].cumsum(-1)
    log_ratio = (lp - draft_joint_logprobs.float()).clamp(max=0)
    if tau <= 0:
        passing = torch.ones_like(log_ratio, dtype=torch.bool)
    else:
        passing = log_ratio > torch.log(torch.tensor(float(tau)))
    pos = torch.arange(1, g + 1).expand(B, g)
    eta = torch.where(passing, pos, 0).amax(-1) if g else torch.zeros(B, dtype=torch.long)
    bonus = [_sample(target_logprobs[b, int(eta[b])].float().exp(), float(uniforms[b])) for b in range(B)]
    paths = [list(range(int(e) + 1)) for e in eta]
    return _finish(paths, bonus, B, g + 1, draft_tokens.device)


def _topn_expand(parent_scores, child_logprobs, n, *, per_parent_k=None):
    # Shape: parent_scores [B, P], child_logprobs [B, P, V] -> scores/tokens/parent [B, n].
    B, P, V = child_logprobs.shape
    k = min(per_parent_k or n, V)
    s, t = (parent_scores.float()[..., None] + child_logprobs.float()).topk(k, dim=-1)  # [B, P, k]
    flat = s.reshape(B, P * k)
    m = min(n, P * k)
    best, where = flat.topk(m, dim=-1)
    parent = (where // k).to(torch.int32)
    token = t.reshape(B, P * k).gather(-1, where).to(torch.int32)
    if m < n:  # fewer candidates than asked: pad with -inf scores
        pad = n - m
        best = torch.cat([best, best.new_full((B, pad), float("-inf"))], -1)
        token = torch.cat([token, token.new_zeros((B, pad))], -1)
        parent = torch.cat([parent, parent.new_zeros((B, pad))], -1)
    return best, token, parent


def _select_topn_subtree(parents, scores, n, num_nodes=None):
    # The best n nodes (root included) by score, ties to the lower index, as a re-indexed tree.
    # Shape: parents int32 [B, T], scores [B, T] -> keep_idx, new_parents int32 [B, n], counts [B].
    B, T = parents.shape
    keep_idx = torch.full((B, n), -1, dtype=torch.int32)
    new_par = torch.full((B, n), -1, dtype=torch.int32)
    counts = torch.zeros(B, dtype=torch.int32)
    P, S = parents.tolist(), scores.float().tolist()
    nn = [T] * B if num_nodes is None else num_nodes.tolist()
    for b in range(B):
        eff = [float("inf")] + [0.0] * (T - 1)
        for i in range(1, nn[b]):
            s = S[b][i] if S[b][i] == S[b][i] else float("-inf")
            eff[i] = min(s, eff[P[b][i]])
        cand = sorted((-eff[i], i) for i in range(1, nn[b]) if eff[i] > float("-inf"))
        chosen = sorted([0] + [i for _, i in cand[: n - 1]])
        pos = {i: j for j, i in enumerate(chosen)}
        for j, i in enumerate(chosen):
            keep_idx[b, j] = i
            new_par[b, j] = -1 if i == 0 else pos[P[b][i]]
        counts[b] = len(chosen)
    return keep_idx, new_par, counts
