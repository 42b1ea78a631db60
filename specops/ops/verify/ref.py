"""The torch reference of the verification ops: the spec every other backend equals bit for bit.

It walks each sequence in Python, as ``csrc/verify_common.h`` does in C++, with numpy float32
scalars (one IEEE single operation each, never Python's double) and fp32 rows. The arithmetic
contract that makes integer outputs identical on every backend:

* probabilities enter sums as fixed-point weights ``trunc(clamp(x, 0, 1) * 2**S)`` (int64,
  ``S = 62 - ceil(log2 V)``), so sums are exact in any order; NaN weighs 0;
* a draw is the inverse CDF of those weights: the first index whose running weight sum exceeds
  ``min(trunc(u * float(W)), W - 1)``;
* the child test is ``(u * q) * Z < r * Zq`` and the residual ``max(0, r * Zq - Z * q)``, each
  product and difference rounded on its own (no FMA);
* R6's ``exp`` of a log-probability and ``log`` of a probability are :func:`det_exp` and
  :func:`det_log`, built from the same single operations."""
import numpy as np
import torch

from ..token_bitmask.ref import allowed_tokens

F32 = np.float32
RESIDUAL_FLOOR = F32(1e-12)

_LOG2E = F32(1.44269502162933349609375)
_LN2_HI = F32(0.693145751953125)
_LN2_LO = F32(1.428606765330187045037746429443359375e-06)
_EXP_C = [F32(1.0), F32(1.0), F32(0.5), F32(1 / 6), F32(1 / 24), F32(1 / 120), F32(1 / 720), F32(1 / 5040)]


def fix_shift(V):
    """S such that V weights of at most 2**S sum below 2**63."""
    return 62 - max(0, int(V - 1).bit_length())


def _i2f(w):
    # int64 -> fp32 rounded once (numpy would round through float64 first).
    return F32(torch.tensor(w, dtype=torch.int64).to(torch.float32).item())


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


def fix_weights(x, S):
    """Fixed-point weights of a row. Shape: x fp32 [V] -> int64 [V]."""
    c = torch.where(x > 0, x.clamp(max=1.0), torch.zeros((), dtype=x.dtype))
    return (c * _t(2.0**S)).to(torch.int64)


def sample_weights(w, u):
    """Inverse-CDF draw with uniform ``u`` over int64 weights ``w`` [V] (token 0 if all are 0)."""
    W = int(w.sum())
    if W <= 0:
        return 0
    wf = _i2f(W)
    f = F32(u) * wf
    t = int(min(f, wf)) if f > 0 else 0
    t = min(t, W - 1)
    return int(torch.searchsorted(torch.cumsum(w, 0), torch.tensor([t]), right=True)[0])


def accept_child(u, q, Z, r, Zq):
    """Accept with probability min(1, (r / Z) / (q / Zq)), without a division."""
    return bool((F32(u) * F32(q)) * F32(Z) < F32(r) * F32(Zq))


def uniform_index(u, n):
    f = F32(u) * F32(n)
    return int(min(f, F32(n - 1))) if f > 0 else 0


def residual_fallback(Zn, Z, Zq):
    return not (Zn > 0) or Zn < (RESIDUAL_FLOOR * F32(Z)) * F32(Zq)


def det_exp(x):
    """exp of fp32 log-probabilities from single IEEE operations (clamped to [-50, 0])."""
    zero = torch.zeros((), dtype=torch.float32)
    x = torch.where(x > -50, torch.where(x < 0, x, zero), _t(-50.0))
    k = torch.floor(x * _t(_LOG2E) + _t(0.5))
    r = (x - k * _t(_LN2_HI)) - k * _t(_LN2_LO)
    p = _t(_EXP_C[7]).expand_as(r)
    for c in reversed(_EXP_C[:7]):
        p = p * r + _t(c)
    two_k = ((k.to(torch.int32) + 127) << 23).view(torch.float32)
    return p * two_k


_SQRT2 = F32(1.41421353816986083984375)
_LOG1P_C = [F32((-1) ** (n + 1) / n) for n in range(1, 21)]  # fp32((-1)^(n+1) / n), n = 1..20


def det_log(x):
    """log of an fp32 probability from single IEEE operations (csrc/verify_common.h det_log): for
    x = m 2**e, m in [sqrt(1/2), sqrt(2)), e ln 2 + a degree-20 Taylor polynomial of log1p(m - 1);
    x below 2**-126 gives -inf, NaN stays NaN. Shape: a scalar -> np.float32."""
    x = F32(x)
    if np.isnan(x):
        return x
    if not x >= F32(2.0**-126):
        return F32(-np.inf)
    bits = int(np.array(x, dtype=F32).view(np.uint32))
    e = (bits >> 23) - 127
    m = np.array((bits & 0x007FFFFF) | 0x3F800000, dtype=np.uint32).view(F32)[()]
    if m > _SQRT2:
        m, e = m * F32(0.5), e + 1
    r = m - F32(1.0)
    p = _LOG1P_C[19]
    for c in reversed(_LOG1P_C[:19]):
        p = p * r + c
    ef = F32(e)
    return ef * _LN2_HI + (ef * _LN2_LO + p * r)


def _children(parents, n, u):
    return [c for c in range(u + 1, n) if int(parents[c]) == u]


def each_sequence(num_nodes, T, device, walk):
    """The ops' outputs on ``device`` from ``walk(b, n)`` -> (path, bonus) of each sequence ``b`` of
    ``n`` nodes (``num_nodes[b]`` clamped to [1, T])."""
    walks = [walk(b, min(max(int(n), 1), T)) for b, n in enumerate(num_nodes.cpu())]
    idx = torch.tensor([path + [-1] * (T - len(path)) for path, _ in walks], dtype=torch.int32).view(-1, T)
    lens = torch.tensor([len(path) for path, _ in walks], dtype=torch.int32)
    bonus = torch.tensor([bonus for _, bonus in walks], dtype=torch.int32)
    return idx.to(device), lens.to(device), bonus.to(device)


def match_walk(tokens, parents, n, predict):
    """R1 / R4: descend into the first child whose token is the prediction at the node."""
    path, u = [0], 0
    while True:
        v = predict(u)
        kids = [c for c in _children(parents, n, u) if int(tokens[c]) == v]
        if not kids:
            return path, v
        u = kids[0]
        path.append(u)


def mss_walk(mode, tokens, parents, n, P, Q, U, S):
    """R2 / R3 / R3p / R3w on one sequence; see mss_walk in csrc/verify_common.h."""
    V = P.shape[1]
    inv = F32(2.0**-S)
    path, u = [0], 0
    while True:
        kids = _children(parents, n, u)
        R, Z = P[u].clone(), F32(1.0)  # current target distribution R / Z
        Qr, Zq = (Q[kids[0]].clone() if mode == "mss_noreplace" and kids else None), F32(1.0)
        d, accepted = u, None
        while kids:
            j = uniform_index(U[d, 1], len(kids)) if mode == "mss" and len(kids) > 1 else 0
            s = kids.pop(j)
            x = int(tokens[s])
            valid = 0 <= x < V
            r = F32(R[x]) if valid else F32(0)
            q_row = None if mode == "mss_pointmass" else Qr if mode == "mss_noreplace" else Q[s]
            q = F32(1.0) if q_row is None else F32(q_row[x]) if valid else F32(0)
            d = s
            if accept_child(U[s, 0], q, Z, r, Zq):
                accepted = s
                break
            if mode == "mss_pointmass":  # the residual of a point mass: R without x (Zq stays 1)
                if not valid:
                    continue
                new = R.clone()
                new[x] = 0.0
            else:
                c = R * _t(Zq) - _t(Z) * q_row
                new = torch.where(c > 0, c, torch.zeros((), dtype=c.dtype))
            Zn = _i2f(int(fix_weights(new, S).sum())) * inv
            fallback = residual_fallback(Zn, Z, Zq)
            if mode == "mss_noreplace":
                Qr = Qr.clone()
                if valid:
                    Qr[x] = 0.0
                Zq = _i2f(int(fix_weights(Qr, S).sum())) * inv
            if not fallback:
                R, Z = new, Zn
        if accepted is None:
            return path, sample_weights(fix_weights(R, S), U[d, 1])
        u = accepted
        path.append(u)


def gsd_walk(tokens, parents, n, P, Q, U, S):
    """R5: the deepest node whose root path passes every edge test (lowest index among equals)."""
    V = P.shape[1]
    depth, best = {0: 0}, 0
    for c in range(1, n):
        par, x = int(parents[c]), int(tokens[c])
        if not (0 <= par < c) or par not in depth:
            continue
        p = F32(P[par, x]) if 0 <= x < V else F32(0)
        q = F32(Q[c, x]) if 0 <= x < V else F32(0)
        if accept_child(U[c, 0], q, F32(1.0), p, F32(1.0)):
            depth[c] = depth[par] + 1
            if depth[c] > depth[best]:
                best = c
    path = [best]
    while path[-1] != 0:
        path.append(int(parents[path[-1]]))
    return path[::-1], sample_weights(fix_weights(P[best], S), U[best, 1])


def each_tree(mode, tokens, parents, uniforms, num_nodes, V, rows):
    """verify_tree's walks; ``rows(b)`` -> sequence ``b``'s target and draft rows (or None), each
    indexable as ``[u]`` and ``[u, x]``."""
    S = fix_shift(V)
    tok, par, U = tokens.cpu(), parents.cpu(), uniforms.cpu()

    def walk(b, n):
        P, Q = rows(b)
        if mode == "sample_match":
            return match_walk(tok[b], par[b], n, lambda u: sample_weights(fix_weights(P[u], S), U[b, u, 1]))
        if mode == "gsd":
            return gsd_walk(tok[b], par[b], n, P, Q, U[b], S)
        return mss_walk(mode, tok[b], par[b], n, P, Q, U[b], S)

    return each_sequence(num_nodes, tokens.shape[1], tokens.device, walk)


def each_chain(draft_tokens, log_tau, draft_joint_logprobs, uniforms, num_nodes, V, rows):
    """R6 (csrc/verify_common.h joint_eta): ``eta``, the end of the longest prefix passing ``tau <
    min(1, p_joint / q_joint)`` (not the first failure; ``p_joint`` accumulated in fp32, left to
    right), then a draw from row ``eta``. ``rows(b)`` -> (``logp(row, x)``: the test's fp32
    log-probability, ``bonus(row)``: fp32 [V])."""
    S = fix_shift(V)
    tok, lt, lq, U = (t.cpu() for t in (draft_tokens, log_tau, draft_joint_logprobs, uniforms))

    def walk(b, n):
        logp, bonus = rows(b)
        joint, eta, log_tau = F32(0.0), 0, F32(lt[b])
        for j in range(1, n):
            x = int(tok[b, j - 1])
            joint = joint + (F32(logp(j - 1, x)) if 0 <= x < V else F32(-np.inf))
            if log_tau == -np.inf or (log_tau < 0 and joint - F32(lq[b, j - 1]) > log_tau):
                eta = j
        return list(range(eta + 1)), sample_weights(fix_weights(bonus(eta), S), U[b])

    return each_sequence(num_nodes, draft_tokens.shape[1] + 1, draft_tokens.device, walk)


def verify_greedy(tokens, parents, target_logits, num_nodes, bitmask=None):
    tok, par, logits = tokens.cpu(), parents.cpu(), target_logits.cpu().float()
    if bitmask is not None:  # the disallowed logits as -inf (apply_token_bitmask's rule)
        logits = logits.masked_fill(~allowed_tokens(bitmask.cpu(), logits.shape[-1]), float("-inf"))
    logits = torch.where(torch.isnan(logits), torch.inf, logits)  # NaN counts as +inf; ties: the first index
    return each_sequence(num_nodes, tokens.shape[1], tokens.device,
                         lambda b, n: match_walk(tok[b], par[b], n, lambda u: int(logits[b, u].argmax())))


def verify_tree(tokens, parents, target_probs, uniforms, draft_probs, num_nodes, mode):
    P, Q = target_probs.cpu(), None if draft_probs is None else draft_probs.cpu()
    return each_tree(mode, tokens, parents, uniforms, num_nodes, P.shape[2],
                     lambda b: (P[b], None if Q is None else Q[b]))


def verify_joint(draft_tokens, target_logprobs, draft_joint_logprobs, log_tau, uniforms):
    B, T, V = target_logprobs.shape
    L = target_logprobs.cpu()
    return each_chain(draft_tokens, log_tau, draft_joint_logprobs, uniforms, torch.full((B,), T), V,
                      lambda b: (lambda row, x: L[b, row, x], lambda row: det_exp(L[b, row])))
