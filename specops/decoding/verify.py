"""Verification dispatch: one call per iteration for the whole ragged batch, by mode.

Everything stays on the device: the verify op's ``accept_idx`` / ``accept_lens`` go straight into
the target's ``kv_compact`` (the loop masks finished sequences), and the loop reads back, once per
step, one packed int64 vector (``VerifyResult.read``) with what the host must emit and what the
drafters need (accepted paths and their tokens, bonus tokens and, for drafters that ask, the
target's argmax)."""
import dataclasses

import torch

from ..ops.verify import NEEDS_DRAFT
from ..ops.verify.logits import fuses_bitmask  # noqa: F401  (the loop's question, answered by the policy)
from . import _kernels
from .sampling import SamplingConfig


@dataclasses.dataclass
class VerifyResult:
    """Device outputs: ``accept_idx`` int32 [B, A] (accepted node indices, root first; entries at
    or past ``accept_lens[b]`` are padding), ``accept_lens`` int32 [B], ``bonus_t`` int64 [B] (the
    token emitted after the path), ``logits`` [B, T, V] (the target's block logits), ``bitmask``
    int32 [B, T, ceil(V / 32)] or None (a grammar's rows fused into the walk: ``logits`` are unmasked
    then).

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
    bitmask: torch.Tensor = None
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


def verify(mode, draft, logits, sampling, generator, active, bitmask=None):
    """Shape: draft (a Draft: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B]),
    logits [B, T, V], active bool [B], bitmask int32 [B, T, ceil(V / 32)] or None (where
    ``fuses_bitmask``: the grammar's allowed tokens, fused into the walk) -> VerifyResult (device
    tensors; no host read; ``kept`` = ``accept_lens`` with finished sequences masked to 0).
    ``generator`` lives on the logits' device: the uniforms are drawn there."""
    B, T, _ = logits.shape
    uniforms = None if mode == "greedy" else torch.rand(B, T, 2, generator=generator, device=logits.device)
    draft_logits, draft_warp, joint = None, None, None  # the draft rows a rejection mode tests nodes against
    if mode in NEEDS_DRAFT and draft.draft_logits is not None:
        draft_logits, draft_warp = draft.draft_logits, draft.draft_warp
    elif mode in NEEDS_DRAFT:  # no row at all: uniform (zero logits, one row expanded, not [B, T, V])
        draft_logits, draft_warp = logits.new_zeros((1, 1, 1)).float().expand(logits.shape), _AS_IS
    if mode == "joint" and draft.log_q_joint is not None:  # R6's inputs (none for a block of roots alone)
        joint = draft.log_q_joint, float(draft.joint_tau), SamplingConfig(*draft.joint_warp)
    idx, kept, bonus = verify_kept(draft.tokens, draft.parents, draft.num_nodes, logits, uniforms, active,
                                   mode=mode, sampling=sampling, draft_logits=draft_logits, draft_sampling=draft_warp,
                                   bitmask=bitmask, joint=joint)
    return VerifyResult(accept_idx=idx, accept_lens=kept, bonus_t=bonus, logits=logits, kept=kept, bitmask=bitmask)


_AS_IS = SamplingConfig(1.0)  # temperature 1, no top-k / top-p: softmax of the rows


def verify_kept(tokens, parents, num_nodes, logits, uniforms, active, *, mode=None, sampling=None, draft_logits=None,
                draft_sampling=None, bitmask=None, joint=None):
    """The verify op on device tensors, then the accepted lengths masked by ``active``: the part of a
    step from the target's logits to what ``kv_compact`` keeps (no host read, no host data:
    ``torch.compile(fullgraph=True)``-able and CUDA-graph capturable; tests/test_decoding_graph.py).
    ``mode`` None: greedy (R1) without uniforms, else ``mss_pointmass``; ``sampling`` None: T = 1.
    The op of each mode: ``ops.verify.logits.verify_mode``, whose shapes the arguments follow.

    Shape: tokens int64/int32 [B, T], active bool [B], sampling / draft_sampling SamplingConfigs
    (None: as above; the draft's: ``sampling``), joint (R6) None or (log_q_joint fp32 [B, T - 1], tau,
    the test's SamplingConfig) -> (accept_idx int32 [B, T], kept int32 [B], bonus int32 [B])."""
    mode = mode or ("greedy" if uniforms is None else "mss_pointmass")
    idx, lens, bonus = _kernels.verify_mode(mode, tokens.to(torch.int32), parents, logits, uniforms,
                                            num_nodes=num_nodes, sampling=sampling or SamplingConfig(1.0),
                                            draft_logits=draft_logits, draft_sampling=draft_sampling,
                                            bitmask=bitmask, joint=joint)
    return idx, lens * active, bonus
