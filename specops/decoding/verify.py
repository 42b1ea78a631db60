"""Verification dispatch: one call per step for the whole ragged batch, by mode. The verify op's
outputs stay on the device and go straight into the target's ``kv_compact``; the loop reads back one
packed int64 vector per step (``VerifyResult.read``): what the host emits and the drafters need."""
import dataclasses

import torch

from ..ops.verify import NEEDS_DRAFT
from . import _kernels
from .sampling import SamplingConfig, greedy_tokens


@dataclasses.dataclass
class VerifyResult:
    """Device outputs: ``accept_idx`` int32 [B, A] (accepted node indices, root first, then padding),
    ``accept_lens`` int32 [B] (0 for finished sequences: what the target keeps),
    ``bonus_t`` [B] (the token emitted after the path), ``logits`` [B, T, V] (the target's block
    logits, unmasked where ``bitmask`` int32 [B, T, ceil(V / 32)], a grammar's, was fused into the walk).

    Host lists, filled by :meth:`read`: ``paths[b]`` (accepted node indices), ``path_tokens[b]``,
    ``path_src[b]`` (their draft-block nodes, when the draft has ``src``), ``bonus[b]``,
    ``num_nodes[b]``, and the target's argmax after every node (:meth:`target_argmax`)."""
    accept_idx: torch.Tensor
    accept_lens: torch.Tensor
    bonus_t: torch.Tensor
    logits: torch.Tensor
    bitmask: torch.Tensor = None
    paths: list = None
    path_tokens: list = None
    path_src: list = None
    bonus: list = None
    num_nodes: list = None
    _argmax: list = None

    def read(self, draft, active, with_argmax=False):
        """The step's one host read: lens, bonus, node counts, accept_idx, the path's tokens (and draft-block
        nodes, the argmax rows, a device-built tree's depths, which replace ``draft.depth``) packed into one
        int64 vector. ``active[b]`` False gives ``paths[b] = []``."""
        B, A = self.accept_idx.shape
        idx = self.accept_idx.long()
        at_idx = idx.clamp(min=0)  # padding entries are -1
        parts = [self.accept_lens.long(), self.bonus_t.long(), draft.num_nodes.long(), idx.reshape(-1),
                 draft.tokens.gather(1, at_idx).reshape(-1)]
        if draft.src is not None:
            parts.append(draft.src.long().gather(1, at_idx).reshape(-1))
        if with_argmax:
            parts.append(greedy_tokens(self.logits).reshape(-1))
        depth_on_device = isinstance(draft.depth, torch.Tensor)  # a tree built on the device (OPT-Tree)
        if depth_on_device:
            parts.append(draft.depth.long())
        flat = torch.cat(parts).tolist()
        if depth_on_device:
            draft.depth, flat = flat[-B:], flat[:-B]
        lens, self.bonus, self.num_nodes = flat[:B], flat[B: 2 * B], flat[2 * B: 3 * B]

        def rows(i):  # the accepted part of each row of the i-th [B, A] block after those three [B] vectors
            at = 3 * B + i * B * A
            return [flat[at + b * A: at + b * A + lens[b]] if active[b] else [] for b in range(B)]
        self.paths, self.path_tokens = rows(0), rows(1)
        if draft.src is not None:
            self.path_src = rows(2)
        if with_argmax:  # [B, T] after the [B, A] blocks
            at, T = 3 * B + (2 if draft.src is None else 3) * B * A, self.logits.shape[1]
            self._argmax = [flat[at + b * T: at + (b + 1) * T] for b in range(B)]

    def target_argmax(self):
        """Per sequence, the target's argmax after every block node: read with the step's packed read when
        the drafter sets ``needs_target_argmax``, else one more read."""
        if self._argmax is None:
            self._argmax = greedy_tokens(self.logits).tolist()
        return self._argmax


def verify(mode, draft, logits, sampling, generator, active, bitmask=None):
    """Shape: draft (a Draft: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B]),
    logits [B, T, V], active bool [B], bitmask int32 [B, T, ceil(V / 32)] or None (where
    ``fuses_bitmask``: the grammar's allowed tokens, fused into the walk) -> VerifyResult (device
    tensors, no host read). ``generator`` lives on the logits' device: the uniforms are drawn there."""
    B, T, _ = logits.shape
    uniforms = None if mode == "greedy" else torch.rand(B, T, 2, generator=generator, device=logits.device)
    draft_logits, draft_warp, joint = None, None, None  # the draft rows a rejection mode tests nodes against
    if mode in NEEDS_DRAFT:
        draft_logits, draft_warp = draft.draft_logits, draft.draft_warp
    if mode in NEEDS_DRAFT and draft_logits is None:  # no row at all: uniform (zero logits at temperature 1)
        draft_logits, draft_warp = logits.new_zeros(()).float().expand(logits.shape), SamplingConfig(1.0)
    if mode == "joint" and draft.log_q_joint is not None:  # R6's inputs (none for a block of roots alone)
        joint = draft.log_q_joint, float(draft.joint_tau), SamplingConfig(*draft.joint_warp)
    idx, kept, bonus = verify_kept(draft.tokens, draft.parents, draft.num_nodes, logits, uniforms, active,
                                   mode=mode, sampling=sampling, draft_logits=draft_logits, draft_sampling=draft_warp,
                                   bitmask=bitmask, joint=joint)
    return VerifyResult(accept_idx=idx, accept_lens=kept, bonus_t=bonus, logits=logits, bitmask=bitmask)


def verify_kept(tokens, parents, num_nodes, logits, uniforms, active, *, mode=None, sampling=None, draft_logits=None,
                draft_sampling=None, bitmask=None, joint=None):
    """``ops.verify.logits.verify_mode`` (whose shapes the arguments follow), then the accepted lengths
    masked by ``active``: a step from the target's logits to what ``kv_compact`` keeps, without host
    reads or host data (compilable, CUDA-graph capturable: tests/test_decoding_graph.py). ``mode``
    None: greedy without uniforms, else ``mss_pointmass``. Shape: tokens int64/int32 [B, T], active
    bool [B], sampling / draft_sampling SamplingConfigs (None: temperature 1; the draft's:
    ``sampling``), joint (R6) None or (log_q_joint fp32 [B, T - 1], tau, the test's SamplingConfig)
    -> (accept_idx int32 [B, T], kept int32 [B], bonus int32 [B])."""
    mode = mode or ("greedy" if uniforms is None else "mss_pointmass")
    idx, lens, bonus = _kernels.verify_mode(mode, tokens.to(torch.int32), parents, logits, uniforms,
                                            num_nodes=num_nodes, sampling=sampling or SamplingConfig(1.0),
                                            draft_logits=draft_logits, draft_sampling=draft_sampling,
                                            bitmask=bitmask, joint=joint)
    return idx, lens * active, bonus
