"""The specops ops the loop calls, their value checks (a host sync and a pass over the [B, T, V] rows
each) off by default: the inputs come from the loop's own drafters. ``SPECOPS_CHECK=1`` (or ``CHECK =
True``) turns them on to debug a new drafter; shape checks always run inside the ops."""
import os

from ..ops import sampling as sampling_ops
from ..ops import topn as topn_ops
from ..ops.verify import logits as verify_logits_ops

CHECK = os.environ.get("SPECOPS_CHECK", "0") == "1"


def warp_probs(logits, temperature, top_k=0, top_p=1.0):
    return sampling_ops.warp_probs(logits, temperature, top_k, top_p, check=CHECK)


def verify_mode(mode, tokens, parents, target_logits, uniforms, *, num_nodes, sampling, draft_logits=None,
                draft_sampling=None, bitmask=None, joint=None):
    """The verify op of ``mode`` (ops.verify.logits.verify_mode). ``sampling``, ``draft_sampling``: the
    target's and the draft rows' SamplingConfigs (None: the target's); ``joint``: None or (log_q_joint,
    tau, the test's SamplingConfig)."""
    d = draft_sampling or sampling
    kw = {}
    if joint is not None:
        lq, tau, jw = joint
        kw = {"joint_logprobs": lq, "tau": tau, "joint_temperature": float(jw.temperature),
              "joint_top_k": int(jw.top_k), "joint_top_p": float(jw.top_p)}
    return verify_logits_ops.verify_mode(mode, tokens, parents, target_logits, uniforms, num_nodes=num_nodes,
                                         temperature=float(sampling.temperature), top_k=int(sampling.top_k),
                                         top_p=float(sampling.top_p), draft_logits=draft_logits,
                                         draft_temperature=float(d.temperature), draft_top_k=int(d.top_k),
                                         draft_top_p=float(d.top_p), bitmask=bitmask, check=CHECK, **kw)


def topn_expand(parent_scores, child_logprobs, n, *, per_parent_k=None):
    return topn_ops.topn_expand(parent_scores, child_logprobs, n, per_parent_k=per_parent_k, check=CHECK)


def select_topn_subtree(parents, scores, n, num_nodes=None):
    return topn_ops.select_topn_subtree(parents, scores, n, num_nodes, check=CHECK)
