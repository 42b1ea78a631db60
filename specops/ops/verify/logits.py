"""Sampled verification straight from logits, ``warp_probs`` fused in without a ``[B, T, V]``
probability tensor (docs/verify_logits.md §Contract, §Design): ``verify_tree_logits`` (``verify_tree``'s
rules), ``verify_joint_logits`` (R6, its two row kinds, the test's warp and the bonus's, over one
logits tensor) and ``verify_mode``, the mode -> op policy the decoding loop calls (R1-R6)."""
import torch

from ...backend import register_op, resolve
from .. import checks, token_bitmask
from ..sampling import FLOAT_DTYPES, vocab_limit, warp_params
from ..sampling.ref import warp_probs as warp_probs_torch
from . import (MODES, NEEDS_DRAFT, fake_outputs, joint_args, joint_rule, ref, tau_rule, tree_args,
               tree_value_rules, triton_kernel, verify_greedy)

raise_flags = checks.raise_first  # the value checks of this module's ops (one host sync; tests stub it)


def verify_tree_logits(tokens, parents, target_logits, uniforms, *, temperature, top_k=0, top_p=1.0,
                       draft_logits=None, draft_temperature=None, draft_top_k=0, draft_top_p=1.0, mode,
                       num_nodes=None, bitmask=None, check=True, backend=None):
    """``verify_tree`` on ``warp_probs`` of the logits, bit for bit on every backend (docs/verify_logits.md
    §Contract: the composition, ``check=True``, the bitmask).

    Shape: tokens, parents int32 [B, T], target_logits fp32/bf16/fp16 [B, T, V] (row ``u``: after
    node ``u``), uniforms fp32 [B, T, 2], draft_logits like target_logits or None (row ``c``: the
    draft's at ``parents[c]``; needed by ``NEEDS_DRAFT``), temperature / top_p float or float tensor
    [B], top_k int or int tensor [B] (the draft's likewise; ``draft_temperature=None``: the target's),
    num_nodes int32 [B] or None (= T), bitmask int32 [B, T, ceil(V / 32)] or None -> ``verify_tree``'s
    outputs. Limit: ``V <= 2**31 - 1`` on the compiled backends."""
    B, T, V, num_nodes = tree_args(tokens, parents, num_nodes, mode, "target_logits", target_logits,
                                   FLOAT_DTYPES, uniforms, draft_logits, bitmask)
    if mode not in NEEDS_DRAFT:  # a draft the mode does not read is neither checked nor passed on
        draft_logits = None
    impl, params, draft = _warps_and_impl("verify_tree_logits", _verify_tree_logits_torch, backend, B, T, V,
                                          tokens.device, check, (temperature, top_k, top_p),
                                          (draft_temperature, draft_top_k, draft_top_p), "draft_")
    if check:
        rules, valid, child = tree_value_rules(tokens, parents, num_nodes, V, uniforms, bitmask)
        allowed = None if bitmask is None else token_bitmask.allowed_tokens(bitmask, V)  # [B, T, V]
        rules += checks.logit_rules("target_logits", target_logits, valid, allowed)
        if draft_logits is not None:
            at_parent = None if allowed is None else _at_parents(allowed, parents)
            rules += checks.logit_rules("draft_logits", draft_logits, child, at_parent)
        raise_flags(rules)
    return impl(tokens, parents, target_logits, uniforms, *params, draft_logits, *draft, num_nodes, mode, bitmask)


def verify_joint_logits(draft_tokens, target_logits, draft_joint_logprobs, tau, uniforms, *, temperature, top_k=0,
                        top_p=1.0, bonus_temperature=None, bonus_top_k=0, bonus_top_p=1.0, num_nodes=None, check=True,
                        backend=None):
    """R6 (MJSD, docs/methods.md §R6 joint likelihood) from logits, without a [B, g + 1, V]
    log-probability tensor: ``verify_joint``'s test with ``p_joint`` accumulating ``det_log(P[b, j - 1,
    x_j])`` (``P``: ``warp_probs`` under the test's warp), then verify_tree's inverse-CDF draw with
    ``uniforms[b]`` from row ``eta`` under the bonus warp (the argmax if greedy).

    Shape: draft_tokens int32 [B, g], target_logits fp32/bf16/fp16 [B, g + 1, V] (row ``i``: after
    the root and ``i`` drafts), draft_joint_logprobs fp32 [B, g] (``log q(x_1..x_j)``), tau float or
    fp32 [B] in [0, 1], uniforms fp32 [B], temperature / top_p float or float tensor [B], top_k int or
    int tensor [B] (the test's warp; the bonus's likewise, ``bonus_temperature=None``: the test's),
    num_nodes int32 [B] or None (= g + 1; a sequence tests its first ``num_nodes[b] - 1`` drafts) ->
    (accept_idx int32 [B, g + 1], accept_lens, bonus int32 [B]). ``check=True`` (one host sync):
    draft tokens in [0, V) and joint log-probabilities <= 0 (not NaN) where tested, tau in [0, 1],
    uniforms in [0, 1), the per-row parameters, logits rows at valid nodes (no NaN / +inf, not all
    -inf), num_nodes in [1, g + 1]. Limit: ``V <= 2**31 - 1`` on the compiled backends."""
    B, g, V, tau = joint_args(draft_tokens, "target_logits", target_logits, FLOAT_DTYPES, draft_joint_logprobs, tau,
                              uniforms)
    T, dev = g + 1, draft_tokens.device
    num_nodes = checks.node_counts(num_nodes, B, T, dev)
    impl, params, bonus = _warps_and_impl("verify_joint_logits", _verify_joint_logits_torch, backend, B, T, V, dev,
                                          check, (temperature, top_k, top_p),
                                          (bonus_temperature, bonus_top_k, bonus_top_p), "bonus_")
    if check:  # positions past a chain's num_nodes are padding
        rows = checks.valid_mask(num_nodes, T)  # [B, T]: rows of the chain's nodes
        tested = rows[:, 1:]  # [B, g]: draft j - 1 is tested when node j is in the chain
        raise_flags([
            checks.rule("num_nodes", num_nodes, (num_nodes < 1) | (num_nodes > T),
                        f"lie in [1, g + 1 = {T}]"),
            checks.rule("draft_tokens", draft_tokens, tested & ((draft_tokens < 0) | (draft_tokens >= V)),
                        f"lie in [0, V={V})"),
            tau_rule(tau), checks.uniform_rule("uniforms", uniforms),
            joint_rule(draft_joint_logprobs, tested),
            *checks.logit_rules("target_logits", target_logits, rows)])
    return impl(draft_tokens, target_logits, draft_joint_logprobs, torch.log(tau), uniforms, *params, *bonus,
                num_nodes)


# ---- the mode -> op policy -----------------------------------------------------------------

VERIFY_MODES = ("greedy",) + MODES + ("joint",)  # every rule a decoding method verifies with (R1-R6)


def fuses_bitmask(mode):
    """Whether :func:`verify_mode` takes a grammar's bitmask into its walk: every mode but ``joint``,
    whose op has no bitmask (its caller masks the logits first)."""
    return mode != "joint"


def verify_mode(mode, tokens, parents, target_logits, uniforms, *, num_nodes=None, temperature=1.0, top_k=0,
                top_p=1.0, draft_logits=None, draft_temperature=None, draft_top_k=0, draft_top_p=1.0, bitmask=None,
                joint_logprobs=None, tau=None, joint_temperature=1.0, joint_top_k=0, joint_top_p=1.0, check=True,
                backend=None):
    """The verify op of a rule: ``greedy`` (R1) -> ``verify_greedy``; ``MODES`` -> ``verify_tree_logits``;
    ``joint`` (R6) -> ``verify_joint_logits`` on the chain ``tokens[:, 1:]``.

    Shape: as ``verify_tree_logits``, with uniforms None for greedy (``joint`` reads ``uniforms[:, 0,
    0]``); temperature / top_k / top_p: the warp of the emitted tokens (R6: of its bonus); bitmask
    where ``fuses_bitmask``; R6: joint_logprobs fp32 [B, T - 1] (None only for T = 1: nothing to
    test), tau, the test's warp joint_* -> (accept_idx int32 [B, T], accept_lens, bonus int32 [B])."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"mode must be one of {VERIFY_MODES}, got {mode!r}")
    if bitmask is not None and not fuses_bitmask(mode):
        raise ValueError(f"bitmask is fused into every mode but 'joint'; mode {mode!r} needs masked logits")
    if mode == "greedy":
        return verify_greedy(tokens, parents, target_logits, num_nodes, bitmask=bitmask, check=check,
                             backend=backend)
    if mode == "joint":
        checks.tensor("uniforms", uniforms, dtype=torch.float32, rank=3)
        B, T = tokens.shape[0], target_logits.shape[1]
        if joint_logprobs is None:  # a chain without drafts (an AR step): the bonus draw alone
            if T != 1:
                raise ValueError(f"joint_logprobs is required for mode='joint' with drafts (T = {T} > 1)")
            joint_logprobs, tau = target_logits.new_zeros((B, 0), dtype=torch.float32), 1.0
        return verify_joint_logits(tokens[:, 1:], target_logits, joint_logprobs, tau, uniforms[:, 0, 0],
                                   temperature=joint_temperature, top_k=joint_top_k, top_p=joint_top_p,
                                   bonus_temperature=temperature, bonus_top_k=top_k, bonus_top_p=top_p,
                                   num_nodes=num_nodes, check=check, backend=backend)
    return verify_tree_logits(tokens, parents, target_logits, uniforms, temperature=temperature, top_k=top_k,
                              top_p=top_p, draft_logits=draft_logits, draft_temperature=draft_temperature,
                              draft_top_k=draft_top_k, draft_top_p=draft_top_p, mode=mode, num_nodes=num_nodes,
                              bitmask=bitmask, check=check, backend=backend)


def _warps_and_impl(op, torch_impl, backend, B, T, V, dev, check, first, second, prefix):
    """-> (``op``'s implementation, checked for ``V <= MAX_VOCAB``: the compiled ones index tokens with
    int32; the two warps' per-row parameters (temperature, top_k, top_p: scalars or [B] tensors) as fp32
    / int32 / fp32 [B * T], the second's named with ``prefix``, its temperature None: the first's)."""
    def rows(warp, prefix=""):
        return [r[:, None].expand(B, T).reshape(B * T) for r in warp_params(B, dev, check, *warp, prefix)]

    params = rows(first)
    second = rows((first[0] if second[0] is None else second[0], *second[1:]), prefix)
    return vocab_limit("target_logits", V, resolve(op, dev, backend), torch_impl), params, second


def _at_parents(rows, parents):
    """Row ``parents[b, c]`` of ``rows`` at every node (the root: its own). Shape: rows [B, T, X],
    parents int32 [B, T] -> [B, T, X]."""
    T = rows.shape[1]
    par = parents.long().clamp(0, T - 1)  # the root's parent is -1; padding may hold anything
    par = torch.where(par < torch.arange(T, device=par.device), par, 0)
    return torch.gather(rows, 1, par[..., None].expand(-1, -1, rows.shape[-1]))


# ---- backends ------------------------------------------------------------------------------

class _LazyRows:
    """One sequence's warped rows, computed by warp_probs' reference on first access (from the logits
    masked by the bitmask row, where given): ``rows[u]`` -> fp32 [V]; ``rows[u, x]`` -> its entry."""

    def __init__(self, logits, t, k, p, mask=None):  # logits [T, V]; t, k, p [T]; mask int32 [T, W] or None
        self.logits, self.t, self.k, self.p, self.mask = logits, t, k, p, mask
        self.shape = tuple(logits.shape)
        self._rows = {}

    def __getitem__(self, idx):
        u, rest = (int(idx[0]), idx[1:]) if isinstance(idx, tuple) else (int(idx), ())
        if u not in self._rows:
            s = slice(u, u + 1)
            x = self.logits[s]
            if self.mask is not None:
                x = x.masked_fill(~token_bitmask.allowed_tokens(self.mask[s], x.shape[-1]), float("-inf"))
            self._rows[u] = warp_probs_torch(x, self.t[s], self.k[s], self.p[s])[0]
        row = self._rows[u]
        return row[rest] if rest else row


def _verify_tree_logits_torch(tokens, parents, target_logits, uniforms, t, k, p, draft_logits, dt, dk, dp, num_nodes,
                              mode, bitmask=None):
    B, T, V = target_logits.shape
    X, Y, M = (None if v is None else v.cpu() for v in (target_logits, draft_logits, bitmask))
    MQ = None if M is None else _at_parents(M, parents.cpu())  # draft row c: the mask at parents[c]
    t, k, p, dt, dk, dp = (v.cpu().view(B, T) for v in (t, k, p, dt, dk, dp))

    def rows(b):
        P = _LazyRows(X[b], t[b], k[b], p[b], None if M is None else M[b])
        return P, None if Y is None else _LazyRows(Y[b], dt[b], dk[b], dp[b], None if MQ is None else MQ[b])

    return ref.each_tree(mode, tokens, parents, uniforms, num_nodes, V, rows)


def _verify_joint_logits_torch(draft_tokens, target_logits, draft_joint_logprobs, log_tau, uniforms, t, k, p, bt, bk,
                               bp, num_nodes):
    B, T, V = target_logits.shape
    X = target_logits.cpu()
    t, k, p, bt, bk, bp = (v.cpu().view(B, T) for v in (t, k, p, bt, bk, bp))

    def rows(b):  # the test's rows, the bonus's rows
        P, bonus = _LazyRows(X[b], t[b], k[b], p[b]), _LazyRows(X[b], bt[b], bk[b], bp[b])
        return (lambda row, x: ref.det_log(P[row, x])), bonus.__getitem__

    return ref.each_chain(draft_tokens, log_tau, draft_joint_logprobs, uniforms, num_nodes, V, rows)


register_op("verify_tree_logits", _verify_tree_logits_torch, triton_kernel("verify_tree_logits"), fake_outputs(0))
register_op("verify_joint_logits", _verify_joint_logits_torch, triton_kernel("verify_joint_logits"), fake_outputs(1))
