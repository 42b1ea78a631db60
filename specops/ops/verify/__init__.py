"""Verification: which draft tokens survive a target forward, and the token emitted after them.

Every op returns ``accept_idx`` int32 [B, T] (the accepted root path ``0 = a_0 < ... < a_m`` as node
indices, then -1), ``accept_lens`` int32 [B] (m + 1) and ``bonus`` int32 [B]; the step emits
``tokens[a_1..a_m], bonus``. Terms, the rules R1-R6 and what each uniform is read for: docs/methods.md
§Terms, §Verification rules, §Randomness and the residual floor. Randomness is an input, so a step is a
pure function of its inputs (CUDA-graph safe), bit-identical on every backend (:mod:`.ref`)."""
import torch

from ...backend import register_op, resolve
from .. import checks, token_bitmask
from . import ref

MODES = ("mss", "mss_pointmass", "mss_noreplace", "sample_match", "gsd")
NEEDS_DRAFT = ("mss", "mss_noreplace", "gsd")
ROW_SUM_TOL = 1e-3
_LOGITS = (torch.float32, torch.float16, torch.bfloat16)


def verify_greedy(tokens, parents, target_logits, num_nodes=None, *, bitmask=None, check=True, backend=None):
    """R1 (docs/methods.md §R1 greedy): follow the target's argmax (ties: the lowest token id).

    Shape: tokens, parents int32 [B, T], target_logits fp32/fp16/bf16 [B, T, V], num_nodes int32 [B]
    or None (= T), bitmask int32 [B, T, ceil(V / 32)] or None (a grammar's allowed tokens per node: the
    result of ``apply_token_bitmask(target_logits.clone(), bitmask)`` without that pass) -> the outputs
    above. ``check=True`` validates values (one host sync): tree rules, tokens in [0, V), no NaN / +inf
    among the allowed logits, every bitmask row allowing a token. With ``check=False`` bad values never
    crash a kernel: a token outside [0, V) never matches, malformed parents end the walk."""
    _, _, V, num_nodes = tree_args(tokens, parents, num_nodes, ..., "target_logits", target_logits, _LOGITS,
                                   bitmask=bitmask)
    if check:
        bad = torch.isnan(target_logits) | (target_logits == torch.inf)
        if bitmask is not None:
            bad &= token_bitmask.allowed_tokens(bitmask, V)
        checks.raise_first(tree_value_rules(tokens, parents, num_nodes, V, bitmask=bitmask)[0] + [checks.row_rule(
            "target_logits", bad.any(-1), "not contain NaN or +inf",
            lambda _: checks.at("target_logits", target_logits, bad))])
    return resolve("verify_greedy", tokens.device, backend)(tokens, parents, target_logits, num_nodes, bitmask)


def verify_tree(tokens, parents, target_probs, uniforms, *, draft_probs=None, mode, num_nodes=None,
                check=True, backend=None):
    """Stochastic tree verification (docs/methods.md §Verification rules), ``mode``: ``mss`` (R3; R2 on
    a chain), ``mss_pointmass`` (R3p), ``mss_noreplace`` (R3w), ``sample_match`` (R4) or ``gsd`` (R5,
    not lossless).

    Shape: tokens, parents int32 [B, T], target_probs fp32 [B, T, V] (the warped target at each
    node), uniforms fp32 [B, T, 2], draft_probs fp32 [B, T, V] or None (row ``c``: the distribution
    node ``c`` was drawn from; needed by ``NEEDS_DRAFT``, ``mss_noreplace`` reading at each node its
    first child's row), num_nodes int32 [B] or None (= T) -> the outputs above. ``check=True``
    validates values (one host sync): tree rules, tokens in [0, V), uniforms in [0, 1), finite
    non-negative probability rows summing to 1 (within 1e-3) at valid nodes."""
    _, _, V, num_nodes = tree_args(tokens, parents, num_nodes, mode, "target_probs", target_probs,
                                   torch.float32, uniforms, draft_probs)
    if check:
        rules, valid, child = tree_value_rules(tokens, parents, num_nodes, V, uniforms)
        rules += checks.prob_rules("target_probs", target_probs, valid, ROW_SUM_TOL)
        if draft_probs is not None and mode in NEEDS_DRAFT:
            rules += checks.prob_rules("draft_probs", draft_probs, child, ROW_SUM_TOL)
        checks.raise_first(rules)
    impl = resolve("verify_tree", tokens.device, backend)
    return impl(tokens, parents, target_probs, uniforms, draft_probs, num_nodes, mode)


def verify_joint(draft_tokens, target_logprobs, draft_joint_logprobs, tau, uniforms, *, check=True, backend=None):
    """R6 (MJSD, docs/methods.md §R6 joint likelihood): accept the longest draft prefix passing
    ``tau < min(1, p_joint / q_joint)``, then draw the bonus from the target row after it.

    Shape: draft_tokens int32 [B, g], target_logprobs fp32 [B, g + 1, V] (row ``i``: the warped
    target log-distribution after the root and ``i`` drafts), draft_joint_logprobs fp32 [B, g]
    (``log q(x_1..x_j)``), tau float or fp32 [B] in [0, 1], uniforms fp32 [B] -> the outputs above
    (T = g + 1). ``p_joint`` accumulates ``target_logprobs[b, j - 1, x_j]`` left to right in fp32.
    ``check=True`` validates values with one host sync."""
    _, _, V, tau = joint_args(draft_tokens, "target_logprobs", target_logprobs, torch.float32, draft_joint_logprobs,
                              tau, uniforms)
    if check:
        lse = torch.logsumexp(target_logprobs, -1)
        checks.raise_first([
            checks.rule("draft_tokens", draft_tokens, (draft_tokens < 0) | (draft_tokens >= V), f"lie in [0, V={V})",
                        checks.value_at),
            tau_rule(tau), checks.uniform_rule("uniforms", uniforms),
            checks.rule("target_logprobs", target_logprobs,
                        torch.isnan(target_logprobs) | (target_logprobs == torch.inf), "not contain NaN or +inf"),
            checks.row_rule("target_logprobs", lse.abs() > ROW_SUM_TOL,
                            f"be a log-distribution (logsumexp 0 within {ROW_SUM_TOL})",
                            lambda i: f"{float(lse[i]):.6g}"),
            joint_rule(draft_joint_logprobs, True)])
    return resolve("verify_joint", draft_tokens.device, backend)(draft_tokens, target_logprobs, draft_joint_logprobs,
                                                                 torch.log(tau), uniforms)


# ---- argument checks -----------------------------------------------------------------------

def joint_args(draft_tokens, target_name, target, target_dtype, draft_joint_logprobs, tau, uniforms):
    """R6's metadata rules (no host sync), the target rows named ``target_name`` of ``target_dtype`` (one
    or a tuple). -> (B, g, V, tau as fp32 [B])."""
    checks.tensor("draft_tokens", draft_tokens, dtype=torch.int32, rank=2)
    (B, g), dev = draft_tokens.shape, draft_tokens.device
    V = rows_arg(target_name, target, target_dtype, B, g + 1, dev, "g + 1")
    checks.tensor("draft_joint_logprobs", draft_joint_logprobs, dtype=torch.float32, shape=(B, g), device=dev)
    checks.tensor("uniforms", uniforms, dtype=torch.float32, shape=(B,), device=dev)
    if isinstance(tau, torch.Tensor):  # its values are checked by the op under check=True
        return B, g, V, checks.tensor("tau", tau, dtype=torch.float32, shape=(B,), device=dev)
    if not 0.0 <= checks.scalar("tau", tau, (int, float), "a float or a torch.Tensor", 60) <= 1.0:
        raise ValueError(f"tau must lie in [0, 1], got {tau}")  # a float: checked here, no sync
    return B, g, V, torch.full((B,), float(tau), dtype=torch.float32, device=dev)


def tau_rule(tau):
    """R6's value rule of ``tau`` (fp32 [B]): in [0, 1], not NaN."""
    return checks.rule("tau", tau, (tau < 0) | (tau > 1) | torch.isnan(tau), "lie in [0, 1]")


def joint_rule(draft_joint_logprobs, tested):
    """R6's value rule of ``draft_joint_logprobs`` at the ``tested`` positions: <= 0, not NaN."""
    bad = tested & (torch.isnan(draft_joint_logprobs) | (draft_joint_logprobs > 0))
    return checks.rule("draft_joint_logprobs", draft_joint_logprobs, bad, "be log-probabilities (<= 0, not NaN)")


def tree_args(tokens, parents, num_nodes, mode, target_name, target, dtype, uniforms=None, draft=None,
              bitmask=None):
    """The tree ops' metadata rules (no host sync), in order: ``mode`` (``...``: verify_greedy's, no
    uniforms), the tree, the target rows named ``target_name`` of ``dtype`` (one or a tuple), the
    uniforms, the draft rows (required by NEEDS_DRAFT), the bitmask. -> (B, T, V, num_nodes)."""
    if mode is not ... and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    checks.tensor("tokens", tokens, dtype=torch.int32, rank=2)
    checks.nonempty("tokens", tokens, 1, "node (T >= 1)")
    dev = tokens.device
    checks.tensor("parents", parents, dtype=torch.int32, shape=tuple(tokens.shape), device=dev)
    num_nodes = checks.tree_nodes(parents, num_nodes, False)
    B, T = tokens.shape
    V = rows_arg(target_name, target, dtype, B, T, dev)
    if mode is not ...:
        checks.tensor("uniforms", uniforms, dtype=torch.float32, shape=(B, T, 2), device=dev)
    draft_name = target_name.replace("target", "draft")
    if draft is not None:
        checks.tensor(draft_name, draft, dtype=dtype, shape=(B, T, V), device=dev)
    elif mode in NEEDS_DRAFT:
        raise ValueError(f"{draft_name} is required for mode={mode!r} (shape [B, T, V] = [{B}, {T}, {V}])")
    if bitmask is not None:
        checks.tensor("bitmask", bitmask, dtype=torch.int32, shape=(B, T, (V + 31) // 32), device=dev)
    return B, T, V, num_nodes


def tree_value_rules(tokens, parents, num_nodes, V, uniforms=None, bitmask=None):
    """The tree ops' first value rules, in order: the bitmask rows, the tree and its tokens, the uniforms
    (each where given). -> (rules, valid nodes bool [B, T], valid non-root nodes bool [B, T])."""
    T = tokens.shape[1]
    valid = checks.valid_mask(num_nodes, T)
    rules = ([] if bitmask is None else [token_bitmask.rows_rule(bitmask, V)]) + checks.tree_rules(
        parents, num_nodes, tokens, V) + ([] if uniforms is None else [checks.uniform_rule("uniforms", uniforms)])
    return rules, valid, valid & (torch.arange(T, device=tokens.device) > 0)


def rows_arg(name, rows, dtype, B, T, dev, T_name="T"):
    """A rows argument [B, T, V >= 1] of ``dtype`` (one or a tuple; ``T_name``: T in the error) -> V."""
    checks.tensor(name, rows, dtype=dtype, rank=3, device=dev)
    if rows.shape[:2] != (B, T) or rows.shape[2] < 1:
        raise ValueError(f"{name} must have shape [B, {T_name}, V] = [{B}, {T}, V >= 1], got {tuple(rows.shape)}")
    return rows.shape[2]


# ---- backends ------------------------------------------------------------------------------

def triton_kernel(name):
    """The Triton kernel ``name`` of triton_kernels.verify (verify_logits for ``*_logits``), imported at
    the first call: triton is optional."""
    def call(*args):
        from ...triton_kernels import verify, verify_logits

        return getattr(verify_logits if name.endswith("_logits") else verify, name)(*args)

    return call


def fake_outputs(T_extra):
    """The fake of a verify op: (accept_idx [B, T or g + 1], accept_lens [B], bonus [B]) like its first argument."""
    def fake(tokens, *args, **kwargs):
        B, T = tokens.shape
        return tokens.new_empty((B, T + T_extra)), tokens.new_empty((B,)), tokens.new_empty((B,))
    return fake


register_op("verify_greedy", ref.verify_greedy, triton_kernel("verify_greedy"), fake_outputs(0))
register_op("verify_tree", ref.verify_tree, triton_kernel("verify_tree"), fake_outputs(0))
register_op("verify_joint", ref.verify_joint, triton_kernel("verify_joint"), fake_outputs(1))
