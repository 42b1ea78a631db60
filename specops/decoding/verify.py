"""Verification dispatch: one call per iteration for the whole ragged batch, by mode."""
import dataclasses

import torch

from . import _kernels
from .sampling import sample


@dataclasses.dataclass
class VerifyResult:
    """``paths[b]``: accepted node indices, root first; ``bonus[b]``: the token emitted after them;
    ``logits``: the target's block logits fp32 [B, T, V] (drafters read corrections from them)."""
    paths: list
    bonus: list
    logits: torch.Tensor
    _argmax: list = None

    def target_argmax(self):
        """Per sequence, the target's argmax after every block node (list of lists)."""
        if self._argmax is None:
            self._argmax = self.logits.argmax(-1).tolist()
        return self._argmax


def verify(mode, cand, tokens, parents, num_nodes, logits, state):
    """Shape: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B], logits fp32 [B, T, V]."""
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
    idx, lens, bonus = idx.tolist(), lens.tolist(), bonus.tolist()
    paths = [idx[b][: lens[b]] for b in range(B)]
    return VerifyResult(paths=paths, bonus=bonus, logits=logits)


def _verify_joint(cand, tokens, num_nodes, logits, state):
    # MJSD (R6): the block is a chain [r, x_1..x_g]; the joint test uses MJSD's own warp for p and q,
    # the bonus the generation warp (argmax when greedy), at the first position after the prefix.
    B, T, V = logits.shape
    g = T - 1
    n = num_nodes.tolist()
    temperature, top_k, top_p = cand.extra["joint_warp"]
    from .sampling import SamplingConfig

    jw = SamplingConfig(temperature, top_k, top_p)
    logp = jw.warp(logits.reshape(B * T, V)).reshape(B, T, V).clamp_min(0).log()
    log_q = cand.extra["log_q_joint"].to(logits.device)  # [B, g]
    if g == 0:
        eta = [0] * B
    else:
        uniforms = torch.rand(B, generator=state.generator).to(logits.device)
        _, lens, _ = _kernels.verify_joint(tokens[:, 1:].to(torch.int32), logp, log_q, float(cand.extra["tau"]),
                                        uniforms)
        eta = [min(int(a) - 1, n[b] - 1) for b, a in enumerate(lens.tolist())]
    rows = logits[torch.arange(B), torch.tensor(eta)]
    if state.sampling.greedy:
        bonus = rows.argmax(-1).tolist()
    else:
        bonus = sample(state.sampling.warp(rows), state.generator)
    return VerifyResult(paths=[list(range(e + 1)) for e in eta], bonus=bonus, logits=logits)
