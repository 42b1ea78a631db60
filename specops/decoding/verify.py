"""Verification dispatch: one call per iteration for the whole ragged batch, by mode.

Everything stays on the device: the verify op's ``accept_idx`` / ``accept_lens`` go straight into
the target's ``kv_compact`` (the loop masks finished sequences), and the loop reads back, once per
step, one packed int64 vector (``VerifyResult.read``) with what the host must emit and what the
drafters need (accepted paths, bonus tokens and, for drafters that ask, the target's argmax)."""
import dataclasses

import torch

from . import _kernels
from .sampling import SamplingConfig, draw


@dataclasses.dataclass
class VerifyResult:
    """Device outputs: ``accept_idx`` int32 [B, A] (accepted node indices, root first; entries at
    or past ``accept_lens[b]`` are padding), ``accept_lens`` int32 [B], ``bonus_t`` int64 [B] (the
    token emitted after the path), ``logits`` fp32 [B, T, V] (the target's block logits).

    Host lists, filled by :meth:`read` (the step's one host read): ``paths[b]`` (accepted node
    indices, root first) and ``bonus[b]``; drafters with ``needs_target_argmax`` also get the
    target's argmax after every block node (``target_argmax()``)."""
    accept_idx: torch.Tensor
    accept_lens: torch.Tensor
    bonus_t: torch.Tensor
    logits: torch.Tensor
    paths: list = None
    bonus: list = None
    _argmax: list = None

    def read(self, active, with_argmax=False):
        """The one host read of a step: lens, bonus, accept_idx (and the argmax rows) packed into one
        int64 vector, one ``tolist``. ``active[b]`` False gives ``paths[b] = []`` (nothing kept).

        Shape: -> None; fills ``paths`` (B lists), ``bonus`` (B ints), ``_argmax`` (B lists of T)."""
        B, A = self.accept_idx.shape
        parts = [self.accept_lens.to(torch.int64), self.bonus_t.to(torch.int64),
                 self.accept_idx.to(torch.int64).reshape(-1)]
        if with_argmax:
            parts.append(self.logits.argmax(-1).reshape(-1))
        flat = torch.cat(parts).tolist()
        lens, bonus = flat[:B], flat[B: 2 * B]
        idx = flat[2 * B: 2 * B + B * A]
        self.paths = [idx[b * A: b * A + lens[b]] if active[b] else [] for b in range(B)]
        self.bonus = bonus
        if with_argmax:
            T = self.logits.shape[1]
            rest = flat[2 * B + B * A:]
            self._argmax = [rest[b * T:(b + 1) * T] for b in range(B)]

    def target_argmax(self):
        """Per sequence, the target's argmax after every block node (list of lists). Read with the
        step's packed read when the drafter sets ``needs_target_argmax``; otherwise one more read."""
        if self._argmax is None:
            self._argmax = self.logits.argmax(-1).tolist()
        return self._argmax


def verify(mode, cand, tokens, parents, num_nodes, logits, state):
    """Shape: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B], logits fp32 [B, T, V]
    -> VerifyResult (device tensors; no host read)."""
    B, T, V = logits.shape
    tok32 = tokens.to(torch.int32)
    if mode == "greedy":
        idx, lens, bonus = _kernels.verify_greedy(tok32, parents, logits, num_nodes)
    elif mode == "joint":
        return _verify_joint(cand, tokens, num_nodes, logits, state)
    else:
        probs = state.sampling.warp(logits.reshape(B * T, V)).reshape(B, T, V)
        uniforms = torch.rand(B, T, 2, generator=state.generator).to(logits.device)
        draft_probs = None
        if mode in ("mss", "mss_noreplace", "gsd"):
            draft_probs = cand.pack_draft_probs(V, logits.device)
        idx, lens, bonus = _kernels.verify_tree(tok32, parents, probs, uniforms, draft_probs=draft_probs,
                                             mode=mode, num_nodes=num_nodes)
    return VerifyResult(accept_idx=idx, accept_lens=lens, bonus_t=bonus, logits=logits)


def _verify_joint(cand, tokens, num_nodes, logits, state):
    # MJSD (R6): the block is a chain [r, x_1..x_g]; the joint test uses MJSD's own warp for p and q,
    # the bonus the generation warp (argmax when greedy), at the first position after the prefix.
    B, T, V = logits.shape
    g = T - 1
    dev = logits.device
    temperature, top_k, top_p = cand.extra["joint_warp"]
    if g == 0:
        eta = torch.zeros(B, dtype=torch.int64, device=dev)
    else:
        jw = SamplingConfig(temperature, top_k, top_p)
        logp = jw.warp(logits.reshape(B * T, V)).reshape(B, T, V).clamp_min(0).log()
        log_q = cand.extra["log_q_joint"].to(dev)  # [B, g]
        uniforms = torch.rand(B, generator=state.generator).to(dev)
        _, lens, _ = _kernels.verify_joint(tokens[:, 1:].to(torch.int32), logp, log_q, float(cand.extra["tau"]),
                                        uniforms)
        # the accepted prefix ends at node eta (shorter chains of a ragged batch: at their last node)
        eta = torch.minimum(lens.to(torch.int64) - 1, num_nodes.to(torch.int64) - 1)
    rows = logits[torch.arange(B, device=dev), eta]  # [B, V]
    if state.sampling.greedy:
        bonus = rows.argmax(-1)
    else:
        bonus = draw(state.sampling.warp(rows), state.generator)
    idx = torch.arange(T, dtype=torch.int32, device=dev).expand(B, T).contiguous()
    return VerifyResult(accept_idx=idx, accept_lens=(eta + 1).to(torch.int32), bonus_t=bonus, logits=logits)
