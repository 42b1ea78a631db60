"""Verification dispatch: one call per iteration for the whole ragged batch, by mode.

Everything stays on the device: the verify op's ``accept_idx`` / ``accept_lens`` go straight into
the target's ``kv_compact`` (the loop masks finished sequences), and the loop reads back, once per
step, one packed int64 vector (``VerifyResult.read``) with what the host must emit and what the
drafters need (accepted paths and their tokens, bonus tokens and, for drafters that ask, the
target's argmax)."""
import dataclasses

import torch

from . import _kernels
from .sampling import SamplingConfig, draw


@dataclasses.dataclass
class VerifyResult:
    """Device outputs: ``accept_idx`` int32 [B, A] (accepted node indices, root first; entries at
    or past ``accept_lens[b]`` are padding), ``accept_lens`` int32 [B], ``bonus_t`` int64 [B] (the
    token emitted after the path), ``logits`` [B, T, V] (the target's block logits).

    Host lists, filled by :meth:`read` (the step's one host read): ``paths[b]`` (accepted node
    indices, root first), ``path_tokens[b]`` (their tokens), ``path_src[b]`` (their draft-block
    nodes, when the draft has ``src``), ``bonus[b]``, ``num_nodes[b]``; drafters with
    ``needs_target_argmax`` also get the target's argmax after every block node (``target_argmax()``).
    ``kept`` int32 [B]: ``accept_lens`` masked to 0 for finished sequences (what the target keeps)."""
    accept_idx: torch.Tensor
    accept_lens: torch.Tensor
    bonus_t: torch.Tensor
    logits: torch.Tensor
    kept: torch.Tensor = None
    paths: list = None
    path_tokens: list = None
    path_src: list = None
    bonus: list = None
    num_nodes: list = None
    _argmax: list = None

    def read(self, draft, active, with_argmax=False):
        """The one host read of a step: lens, bonus, node counts, accept_idx, the path's tokens (and
        draft-block nodes, the argmax rows, a device-built tree's depths, which replace
        ``draft.depth``) packed into one int64 vector, one ``tolist``.
        ``active[b]`` False gives ``paths[b] = []`` (nothing kept)."""
        B, A = self.accept_idx.shape
        idx = self.accept_idx.long()
        at_idx = idx.clamp(min=0)  # padding entries are -1
        parts = [self.accept_lens.long(), self.bonus_t.long(), draft.num_nodes.long(), idx.reshape(-1),
                 draft.tokens.gather(1, at_idx).reshape(-1)]
        if draft.src is not None:
            parts.append(draft.src.long().gather(1, at_idx).reshape(-1))
        if with_argmax:
            parts.append(self.logits.argmax(-1).reshape(-1))
        depth_on_device = isinstance(draft.depth, torch.Tensor)  # a tree built on the device (OPT-Tree)
        if depth_on_device:
            parts.append(draft.depth.long())
        flat = torch.cat(parts).tolist()
        if depth_on_device:
            draft.depth, flat = flat[-B:], flat[:-B]
        lens, self.bonus, self.num_nodes = flat[:B], flat[B: 2 * B], flat[2 * B: 3 * B]
        at = 3 * B

        def rows():
            nonlocal at
            out = [flat[at + b * A: at + b * A + lens[b]] if active[b] else [] for b in range(B)]
            at += B * A
            return out
        self.paths, self.path_tokens = rows(), rows()
        if draft.src is not None:
            self.path_src = rows()
        if with_argmax:
            T = self.logits.shape[1]
            self._argmax = [flat[at + b * T: at + (b + 1) * T] for b in range(B)]

    def target_argmax(self):
        """Per sequence, the target's argmax after every block node (list of lists). Read with the
        step's packed read when the drafter sets ``needs_target_argmax``; otherwise one more read."""
        if self._argmax is None:
            self._argmax = self.logits.argmax(-1).tolist()
        return self._argmax


def fuses_bitmask(mode, draft):
    """Whether ``verify`` takes a grammar's bitmask into its walk (the op masks the rows it reads)
    for this mode and draft: greedy, and the modes verified from logits; the others need the
    logits masked first."""
    return mode == "greedy" or (mode in _FROM_LOGITS and draft.draft_probs is None)


def verify(mode, draft, logits, sampling, generator, active, bitmask=None):
    """Shape: draft (a Draft: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B]),
    logits [B, T, V], active bool [B], bitmask int32 [B, T, ceil(V / 32)] or None (where
    ``fuses_bitmask``: the grammar's allowed tokens, fused into the walk) -> VerifyResult (device
    tensors; no host read; ``kept`` = ``accept_lens`` with finished sequences masked to 0).
    ``generator`` lives on the logits' device: the uniforms are drawn there."""
    if bitmask is not None and not fuses_bitmask(mode, draft):
        raise ValueError(f"bitmask is fused into greedy and {_FROM_LOGITS} verification without draft rows; "
                         f"mode {mode!r} needs masked logits")
    if mode == "joint":
        result = _verify_joint(draft, logits, sampling, generator)
        result.kept = result.accept_lens * active
        return result
    B, T, V = logits.shape
    uniforms = None if mode == "greedy" else torch.rand(B, T, 2, generator=generator, device=logits.device)
    draft_probs = None
    if mode in ("mss", "mss_noreplace", "gsd"):  # proposer rows; uniform where the drafter has none
        draft_probs = draft.draft_probs if draft.draft_probs is not None else \
            torch.full((B, T, V), 1.0 / V, dtype=torch.float32, device=logits.device)
    idx, kept, bonus = verify_kept(draft.tokens, draft.parents, draft.num_nodes, logits, uniforms, active,
                                   mode=mode, sampling=sampling, draft_probs=draft_probs, bitmask=bitmask)
    return VerifyResult(accept_idx=idx, accept_lens=kept, bonus_t=bonus, logits=logits, kept=kept)


# Modes verified straight from the target's logits. The modes that test draft rows (mss,
# mss_noreplace, gsd) still get warped target probabilities: their drafters hand over draft
# probability rows, not the draft logits verify_tree_logits would warp itself.
_FROM_LOGITS = ("mss_pointmass", "sample_match")


def verify_kept(tokens, parents, num_nodes, logits, uniforms, active, *, mode=None, sampling=None, draft_probs=None,
                bitmask=None):
    """The verify op on device tensors, then the accepted lengths masked by ``active``: the part of a
    step from the target's logits to what ``kv_compact`` keeps (no host read, no host data:
    ``torch.compile(fullgraph=True)``-able and CUDA-graph capturable; tests/test_decoding_graph.py).
    ``mode`` None: greedy (R1) without uniforms, else ``mss_pointmass``; ``sampling`` None: T = 1.

    Shape: tokens int64/int32 [B, T], parents int32 [B, T], num_nodes int32 [B], logits [B, T, V],
    uniforms fp32 [B, T, 2] or None (greedy), active bool [B], draft_probs fp32 [B, T, V] or None,
    bitmask int32 [B, T, ceil(V / 32)] or None (greedy and the modes from logits) -> (accept_idx
    int32 [B, T], kept int32 [B],
    bonus [B])."""
    mode = mode or ("greedy" if uniforms is None else "mss_pointmass")
    tok32 = tokens.to(torch.int32)
    if mode == "greedy":
        idx, lens, bonus = _kernels.verify_greedy(tok32, parents, logits, num_nodes, bitmask)
    elif draft_probs is None and mode in _FROM_LOGITS:
        # the target's warping fused into the walk: no [B, T, V] probability tensor (bit-identical
        # to the composition below, docs/verify_logits.md)
        idx, lens, bonus = _kernels.verify_tree_logits(tok32, parents, logits, uniforms, mode=mode, num_nodes=num_nodes,
                                                       sampling=sampling or SamplingConfig(1.0), bitmask=bitmask)
    else:
        if bitmask is not None:
            raise ValueError(f"bitmask: mode {mode!r} with draft rows needs masked logits")
        B, T, V = logits.shape
        probs = (sampling or SamplingConfig(1.0)).warp(logits.reshape(B * T, V)).reshape(B, T, V)
        idx, lens, bonus = _kernels.verify_tree(tok32, parents, probs, uniforms, draft_probs=draft_probs, mode=mode,
                                                num_nodes=num_nodes)
    return idx, lens * active, bonus


def _verify_joint(draft, logits, sampling, generator):
    # MJSD (R6): the block is a chain [r, x_1..x_g]; the joint test uses MJSD's own warp for p and q,
    # the bonus the generation warp (argmax when greedy), at the first position after the prefix.
    B, T, V = logits.shape
    g = T - 1
    dev = logits.device
    if g == 0:
        eta = torch.zeros(B, dtype=torch.int64, device=dev)
    else:
        jw = SamplingConfig(*draft.joint_warp)
        logp = jw.warp(logits.reshape(B * T, V)).reshape(B, T, V).clamp_min(0).log()
        uniforms = torch.rand(B, generator=generator, device=dev)
        _, lens, _ = _kernels.verify_joint(draft.tokens[:, 1:].to(torch.int32), logp, draft.log_q_joint,
                                           float(draft.joint_tau), uniforms)
        # the accepted prefix ends at node eta (shorter chains of a ragged batch: at their last node)
        eta = torch.minimum(lens.to(torch.int64) - 1, draft.num_nodes.to(torch.int64) - 1)
    rows = logits[torch.arange(B, device=dev), eta]  # [B, V]
    if sampling.greedy:
        bonus = rows.argmax(-1)
    else:
        bonus = draw(sampling.warp(rows), generator)
    idx = torch.arange(T, dtype=torch.int32, device=dev).expand(B, T).contiguous()
    return VerifyResult(accept_idx=idx, accept_lens=(eta + 1).to(torch.int32), bonus_t=bonus, logits=logits)
