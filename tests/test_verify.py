"""verify_greedy / verify_tree / verify_joint: golden cases, every backend vs the reference bit for
bit, invariants, the grammar bitmask, opcheck of the three schemas and torch.compile(fullgraph=True)
over the cpp path. Distribution tests: test_verify_dist.py; bad input: the battery of
tests/test_bad_input.py."""
import math

import pytest
import torch
from _op_checks import assert_same, needs_cpp

import specops
from specops import backend as _backend
from specops.ops.verify import MODES
from specops.ops.verify.ref import det_exp, fix_shift, fix_weights, sample_weights
from specops.testing import random_verify_case

I32 = torch.int32


def rows(*r):
    """[1, T, V] fp32 probability rows from nested lists."""
    return torch.tensor([list(r)], dtype=torch.float32)


def uni(T, coins=None, draws=None, fill=0.5):
    """[1, T, 2] uniforms: coins[c] -> [c, 0], draws[u] -> [u, 1], the rest `fill`."""
    u = torch.full((1, T, 2), fill)
    for col, values in enumerate((coins, draws)):
        for c, v in (values or {}).items():
            u[0, c, col] = v
    return u


def walk(backend, device, tokens, parents, P, U=None, mode=None, Q=None, n=None):
    """One sequence through verify_tree (verify_greedy for mode None, P its logits) -> (path, bonus, idx)."""
    tok, par, n = (None if v is None else torch.tensor([v], dtype=I32) for v in (tokens, parents, n))
    tok, par, n, P, U, Q = (None if v is None else v.to(device) for v in (tok, par, n, P, U, Q))
    if mode is None:
        out = specops.verify_greedy(tok, par, P, n, backend=backend)
    else:
        out = specops.verify_tree(tok, par, P, U, draft_probs=Q, mode=mode, num_nodes=n, backend=backend)
    idx, length, bonus = (o.cpu() for o in out)
    return idx[0, : int(length[0])].tolist(), int(bonus[0]), idx


# ---- golden cases: R1 ----------------------------------------------------------------------------

# name: (tokens, parents, the argmax of each node's row, num_nodes, want path, want bonus)
GREEDY_GOLDEN = {
    # chain 0 -> 1 -> 2 -> 3 whose tokens are the argmax of their parent's row
    "all-accepted-emits-the-bonus": ([9, 4, 2, 7], [-1, 0, 1, 2], [4, 2, 7, 1], None, [0, 1, 2, 3], 1),
    "rejection-at-the-root": ([9, 4, 2], [-1, 0, 0], [5, 2, 7], None, [0], 5),
    # 0 -> (1: tok 3, 2: tok 4, 3: tok 4); 2 -> 4 (tok 6); 3 -> 5 (tok 6)
    "follows-the-matching-branch-and-first-duplicate": ([0, 3, 4, 4, 6, 6], [-1, 0, 0, 0, 2, 3], [4, 0, 6, 6, 8, 8],
                                                        None, [0, 2, 4], 8),
    "ignores-padding-nodes": ([0, 4, 2], [-1, 0, 1], [4, 2, 3], 1, [0], 4),
}


@pytest.mark.parametrize("name", list(GREEDY_GOLDEN))
def test_greedy_golden(backend, device, name):
    tokens, parents, argmaxes, n, path, bonus = GREEDY_GOLDEN[name]
    logits = 5.0 * torch.nn.functional.one_hot(torch.tensor([argmaxes]), 10)
    assert walk(backend, device, tokens, parents, logits, n=n)[:2] == (path, bonus)


def test_greedy_ties_go_to_the_lowest_token_and_low_precision_logits(backend, device):
    logits = torch.zeros(1, 2, 6)
    logits[0, 0, [2, 4]] = 1.0
    logits[0, 1, 5] = -1.0  # all others 0: argmax is token 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        path, bonus, _ = walk(backend, device, [0, 2], [-1, 0], logits.to(dtype))
        assert (path, bonus) == ([0, 1], 0), dtype


# ---- golden cases: R2 / R3 / R3p / R3w / R4 / R5 -------------------------------------------------

def _distinct_siblings(tokens, parents, V):
    """Rewrites tokens so that no two children of a node share one (a greedy path is then unique)."""
    tokens = tokens.clone()
    for b in range(tokens.shape[0]):
        for i in range(1, tokens.shape[1]):
            sib = {int(tokens[b, j]) for j in range(1, i) if int(parents[b, j]) == int(parents[b, i])}
            while int(tokens[b, i]) in sib:
                tokens[b, i] = (int(tokens[b, i]) + 1) % V
    return tokens


@pytest.mark.parametrize("mode", MODES)
def test_one_hot_targets_make_every_mode_greedy(backend, device, mode):
    c = random_verify_case(3, 9, 7, generator=torch.Generator().manual_seed(3), match=0.8, device=device)
    c["tokens"] = _distinct_siblings(c["tokens"], c["parents"], 7)
    c["target_probs"] = torch.nn.functional.one_hot(c["target_logits"].argmax(-1), 7).float()
    want = _run("greedy", c, backend="torch")
    assert_same(_run(mode, c, backend=backend), want, I32)
    assert want[1].float().mean() > 1.5


P_EQ = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]] * 3 + [[0, 0, 0, 1.0, 0]])[None]
P_ROOT, Q_ROOT = rows([0.5, 0.5, 0.0], [1 / 3] * 3), rows([1 / 3] * 3, [0.0, 0.0, 1.0])
P_FLAT = rows(*[[0.25] * 4] * 4)
P_RENORM = rows([0.35, 0.35, 0.3], [1 / 3] * 3, [1 / 3] * 3)
Q_RENORM = rows([1 / 3] * 3, [0.1, 0.3, 0.6], [0.1, 0.3, 0.6])
U_RENORM = uni(3, coins={1: 0.9, 2: 0.4}, draws={0: 0.0, 2: 0.5})
P_EMPTY, Q_EMPTY = rows([0.0, 0.25, 0.75], [1 / 3] * 3), rows([1 / 3] * 3, [0.0, 0.25, 0.75])
P_SM = rows([0.2, 0.3, 0.5], [1, 0, 0], [0, 1, 0], [0, 0, 1])
P_GSD = rows(*[[0.25] * 4] * 5)
Q_GSD = rows(*[[0.25] * 4] * 3, [0.2, 0.2, 0.3, 0.3], [0.25] * 4)
# (name, mode, tokens, parents, target rows P, draft rows Q, uniforms, want path, want bonus or None)
TREE_GOLDEN = [
    *[(f"draft-equal-to-target-accepts-the-whole-chain-{m}", m, [0, 1, 4, 2], [-1, 0, 1, 2], P_EQ, P_EQ.roll(1, 1),
       uni(4, fill=0.999), [0, 1, 2, 3], 3) for m in ("mss", "mss_noreplace", "gsd")],
    ("sample_match-all-accepted-emits-the-bonus", "sample_match", [0, 2, 1], [-1, 0, 1],
     torch.nn.functional.one_hot(torch.tensor([[2, 1, 3]]), 4).float(), None, uni(3), [0, 1, 2], 3),
    # The child's token has target probability 0: always rejected. Residual = [0.5, 0.5, 0] (R5: P).
    # The bonus is drawn with the uniform of the last node tested (R2-R3w), of the path's end (R5).
    *[(f"rejection-at-the-root-draws-with-the-tested-childs-uniform-{m}-{draw}", m, [0, 2], [-1, 0], P_ROOT, Q_ROOT,
       uni(2, draws={0 if m == "gsd" else 1: draw}, fill=0.9), [0], want)
      for m in ("mss", "mss_pointmass", "mss_noreplace", "gsd") for draw, want in ((0.25, 0), (0.75, 1))],
    # Three children, each always accepted (draft = target): which one is tried first is the choice.
    *[(f"mss-picks-children-in-random-order-with-the-nodes-draw-{draw}", "mss", [0, 1, 2, 3], [-1, 0, 0, 0], P_FLAT,
       P_FLAT, uni(4, draws={0: draw}), [0, child], None) for draw, child in ((0.1, 1), (0.5, 2), (0.9, 3))],
    ("mss_noreplace-tries-children-in-index-order", "mss_noreplace", [0, 1, 2, 3], [-1, 0, 0, 0], P_FLAT, P_FLAT,
     uni(4, draws={0: 0.9}), [0, 1], None),
    # p = [0.5, 0.5], both children propose token 0 from q = delta_0. First rejected (coin 0.9 >
    # 0.5): the residual is delta_1, so the duplicate is rejected too and the bonus is 1.
    ("mss-duplicate-children-are-separate-proposals", "mss", [0, 0, 0], [-1, 0, 0], rows(*[[0.5, 0.5]] * 3),
     rows([0.0, 1.0], [1.0, 0.0], [1.0, 0.0]), uni(3, coins={1: 0.9, 2: 0.01}, draws={0: 0.0}), [0], 1),
    # residual [0, 0.6, 0.4], draw 0.99
    ("pointmass-never-accepts-a-rejected-token-twice", "mss_pointmass", [0, 0, 0], [-1, 0, 0],
     rows([0.5, 0.3, 0.2], [1 / 3] * 3, [1 / 3] * 3), None, uni(3, coins={1: 0.6, 2: 0.0}, draws={2: 0.99}), [0], 2),
    # q = [0.1, 0.3, 0.6], p = [0.35, 0.35, 0.3]; children 2 then 1 (drawn without replacement).
    # Child token 2 rejected (coin 0.9 > 0.5): residual [0.8333, 0.1667, 0], q' = [0.25, 0.75, 0].
    # Child token 1: R3 ratio 0.1667 / 0.3 = 0.556 accepts coin 0.4 (draws 0.0: child 1), R3w ratio
    # 0.222 rejects it (residual [0.5833, 0, 0]).
    ("noreplace-renormalises-the-proposer-R3-accepts", "mss", [0, 2, 1], [-1, 0, 0], P_RENORM, Q_RENORM, U_RENORM,
     [0, 2], 1),
    ("noreplace-renormalises-the-proposer-R3w-rejects", "mss_noreplace", [0, 2, 1], [-1, 0, 0], P_RENORM, Q_RENORM,
     U_RENORM, [0], 0),
    # q = p and the child's token has probability 0 under both: rejected, max(0, p - q) = 0.
    *[(f"empty-residual-falls-back-to-the-current-distribution-{draw}", "mss", [0, 0], [-1, 0], P_EMPTY, Q_EMPTY,
       uni(2, draws={1: draw}), [0], want) for draw, want in ((0.2, 1), (0.3, 2))],
    *[(f"sample_match-accepts-the-child-matching-the-draw-{draw}", "sample_match", [0, 2, 1, 0], [-1, 0, 0, 0], P_SM,
       None, uni(4, draws={0: draw}), path, bonus) for draw, path, bonus in ((0.1, [0, 3], 2), (0.3, [0, 2], 1),
                                                                            (0.9, [0, 1], 0))],
    # 0 -> 1 -> 3 (fails: q = 0.3 > p = 0.25, coin 0.99); 0 -> 2 -> 4 passes everywhere.
    ("gsd-takes-the-deepest-passing-path", "gsd", [0, 1, 2, 3, 0], [-1, 0, 0, 1, 2], P_GSD, Q_GSD,
     uni(5, coins={3: 0.99}), [0, 2, 4], None),
]


@pytest.mark.parametrize("case", TREE_GOLDEN, ids=[c[0] for c in TREE_GOLDEN])
def test_tree_golden(backend, device, case):
    _, mode, tokens, parents, P, Q, U, path, bonus = case
    got, got_bonus, idx = walk(backend, device, tokens, parents, P, U, mode, Q=Q)
    assert got == path and (bonus is None or got_bonus == bonus) and idx[0, len(path):].eq(-1).all()


def test_padding_nodes_are_never_accepted(backend, device):
    for mode in MODES:
        path, _, idx = walk(backend, device, [0, 1, 2, 3], [-1, 0, 1, 2], P_FLAT, uni(4), mode, Q=P_FLAT, n=2)
        assert max(path) <= 1 and idx[0, 2:].tolist() == [-1, -1]


# ---- R6 -------------------------------------------------------------------------------------------

def joint(backend, device, tokens, lp, lq, tau, u):
    tokens, lq, u = torch.tensor(tokens, dtype=I32), torch.tensor(lq), torch.tensor(u)
    out = specops.verify_joint(*(t.to(device) for t in (tokens, lp, lq)), tau, u.to(device), backend=backend)
    return [o.cpu() for o in out]


def test_joint_takes_the_longest_passing_prefix_not_the_first_failure(backend, device):
    lp = torch.full((1, 4, 3), math.log(1 / 3))
    lq = [[math.log(1 / 3) + 1.0, math.log(1 / 9) - 1.0, math.log(1 / 27) + 2.0]]  # fail, pass, fail
    idx, length, _ = joint(backend, device, [[0, 1, 2]], lp, lq, 0.5, [0.3])
    assert length.tolist() == [3] and idx.tolist() == [[0, 1, 2, -1]]


def test_joint_tau_zero_accepts_all(backend, device):  # tau = 1 accepts none: below
    lp = torch.log_softmax(torch.randn(2, 4, 7), -1)
    lp[0, 1, :] = -torch.inf  # a zero-probability draft: tau = 0 still accepts it
    lp[0, 1, 0] = 0.0
    lq = [[-1.0, -2.0, -3.0]] * 2
    assert joint(backend, device, [[1, 2, 3]] * 2, lp, lq, 0.0, [0.5, 0.5])[1].tolist() == [4, 4]


def test_joint_tau_one_is_target_only_decoding(backend, device):
    g = torch.Generator().manual_seed(5)
    B, V = 64, 13
    lp = torch.log_softmax(torch.randn(B, 4, V, generator=g) * 2, -1)
    u = torch.rand(B, generator=g)
    idx, length, bonus = joint(backend, device, torch.randint(0, V, (B, 3), generator=g).tolist(), lp,
                               (-torch.rand(B, 3, generator=g)).tolist(), 1.0, u.tolist())
    assert length.eq(1).all() and idx[:, 1:].eq(-1).all()
    S = fix_shift(V)
    want = [sample_weights(fix_weights(det_exp(lp[b, 0]), S), u[b]) for b in range(B)]
    assert bonus.tolist() == want
    # greedy-warped target (one-hot): the bonus is the argmax
    hot = torch.full((B, 4, V), -torch.inf).scatter(2, lp.argmax(-1, keepdim=True), 0.0)
    assert joint(backend, device, [[0, 0, 0]] * B, hot, [[-1.0] * 3] * B, 1.0, u.tolist())[2].tolist() == \
        lp[:, 0].argmax(-1).tolist()


def test_det_exp_is_accurate():
    x = torch.linspace(-49.9, 0, 20011)
    assert torch.allclose(det_exp(x), torch.exp(x), rtol=5e-7, atol=0)
    assert det_exp(torch.tensor([-torch.inf, torch.nan, 3.0, -60.0])).tolist()[2] == 1.0


# ---- every backend vs the reference ----------------------------------------------------------------

# B in {1, 3, 33} x T in {1, 7, 64} in full for V = 11; a spread of them for the larger V.
GRID = [(B, T, 11) for B in (1, 3, 33) for T in (1, 7, 64)]
GRID += [(1, 1, 1000), (1, 64, 1000), (3, 7, 1000), (33, 7, 1000), (33, 64, 1000)]
GRID += [(1, 64, 32000), (3, 7, 32000), (33, 1, 32000)]
TRITON_GRID = [(1, 1, 11), (3, 7, 11), (33, 7, 11), (3, 64, 11), (2, 7, 1000), (1, 7, 32000)]


def _case(B, T, V, device, chain=False):
    g = torch.Generator().manual_seed(B * 7919 + T * 31 + V + chain)
    return random_verify_case(B, T, V, generator=g, device=device, chain=chain)


def _joint_args(c, u=None):
    """verify_joint's (draft_tokens, target_logprobs, draft_joint_logprobs, uniforms) from the case
    ``c``: the chain of its T tokens against T + 1 rows, the uniform ``u`` where given."""
    V = c["target_logits"].shape[2]
    lp = torch.log_softmax(torch.cat([c["target_logits"], c["target_logits"][:, :1]], 1), -1)
    lq = torch.cumsum(torch.log(c["draft_probs"].amax(-1)), 1)
    u = c["uniforms"][:, 0, 0].contiguous() if u is None else torch.full_like(lq[:, 0], u)
    return c["tokens"].clamp(0, V - 1).contiguous(), lp, lq, u


def _run(op, c, tau=None, u=None, **kw):
    """``op`` (greedy, a mode of MODES, or joint with ``tau``: :func:`_joint_args`) on the case ``c``."""
    if op == "greedy":
        return specops.verify_greedy(c["tokens"], c["parents"], c["target_logits"], c["num_nodes"], **kw)
    if op != "joint":
        return specops.verify_tree(c["tokens"], c["parents"], c["target_probs"], c["uniforms"],
                                   draft_probs=c["draft_probs"], mode=op, num_nodes=c["num_nodes"], **kw)
    tokens, lp, lq, u = _joint_args(c, u)
    return specops.verify_joint(tokens, lp, lq, tau, u, **kw)


@pytest.mark.parametrize("op", ["greedy", *MODES, "joint"])
def test_matches_reference(fast_backend, device, op):
    for B, T, V in TRITON_GRID if fast_backend == "triton" and _backend._interpret() else GRID:
        for chain in (False, True) if T > 1 and op in MODES else (False,):
            c = _case(B, T, V, device, chain)
            for tau in (0.0, 0.3, 1.0) if op == "joint" else (None,):
                assert_same(_run(op, c, tau, backend=fast_backend), _run(op, c, tau, backend="torch"), I32)


# ---- large vocabularies: the inverse-CDF draw (issue #15 item 6) ------------------------------------
# The CUDA and Triton draws find the chunk where the running sum passes the threshold from chunk
# totals, then the token inside it: rows with mass on chunk edges, in long zero runs, at the very
# end, and threshold uniforms at exact cumulative boundaries.

LARGE_V = [131072, 262144]


def _skip_slow_interpreted(fast_backend, V):
    if fast_backend == "triton" and _backend._interpret() and V > 131072:
        pytest.skip("the Triton interpreter is slow: V = 131072 covers it")


def _draw_rows(V, g):
    """[12, V] probability rows and [12] uniforms for the inverse-CDF draws."""
    edges = [0, 255, 256, 511, 512, 8191, 8192, V // 2, V - 257, V - 256, V - 1]
    rows = torch.zeros(12, V)
    rows[:2] = (torch.randn(2, V, generator=g) * 3).softmax(-1)
    rows[2:4, edges] = 1.0 / len(edges)
    rows[4, V - 1] = 1.0
    rows[5] = 1.0 / V
    rows[6, ::4099] = 1.0 / len(range(0, V, 4099))
    rows[7, : V // 3] = 3.0 / V
    rows[8, edges[:4]] = torch.tensor([0.125, 0.25, 0.5, 0.125])
    rows[9], rows[11] = rows[1], rows[0]
    rows[10, 12345] = 1.0
    u = torch.rand(12, generator=g)
    u[2], u[3], u[8], u[9], u[11] = 3 / len(edges), 1 - 1e-7, 0.375, 0.0, 0.5  # on boundaries and ends
    return rows, u


@pytest.mark.parametrize("V", LARGE_V)
def test_draws_match_reference_at_large_vocabularies(fast_backend, device, V):
    # sample_match on a lone root draws the bonus from the root's row with its second uniform.
    _skip_slow_interpreted(fast_backend, V)
    rows, u = _draw_rows(V, torch.Generator().manual_seed(V))
    B = rows.shape[0]
    uniforms = torch.stack([torch.zeros(B), u], -1)[:, None]  # [B, 1, 2]
    args = (torch.zeros(B, 1, dtype=I32), torch.full((B, 1), -1, dtype=I32), rows[:, None].contiguous(), uniforms)
    want = specops.verify_tree(*args, mode="sample_match", backend="torch")
    got = specops.verify_tree(*(a.to(device) for a in args), mode="sample_match", backend=fast_backend)
    assert_same(got, want, I32)
    S = fix_shift(V)
    assert want[2].tolist() == [sample_weights(fix_weights(rows[b], S), float(u[b])) for b in range(B)]
    assert want[2][4] == V - 1 and want[2][10] == 12345


@pytest.mark.parametrize("V", LARGE_V)
@pytest.mark.parametrize("op", ["sample_match", "mss", "mss_noreplace", "gsd", "joint"])
def test_matches_reference_at_large_vocabularies(fast_backend, device, V, op):
    _skip_slow_interpreted(fast_backend, V)
    c = _case(2, 3 if op == "joint" else 5, V, device)
    for tau, u in ((0.0, 0.3), (1.0, 0.9)) if op == "joint" else ((None, None),):
        assert_same(_run(op, c, tau, u, backend=fast_backend), _run(op, c, tau, u, backend="torch"), I32)


# ---- invariants --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["greedy", *MODES])
def test_invariants_path_is_a_root_path_then_minus_one(mode):
    for seed in range(4):
        c = random_verify_case(17, 40, 50, generator=torch.Generator().manual_seed(seed), match=0.9)
        idx, lens, bonus = _run(mode, c)
        assert ((bonus >= 0) & (bonus < 50)).all()
        for b in range(17):
            m = int(lens[b])
            path = idx[b, :m].tolist()
            assert 1 <= m <= int(c["num_nodes"][b]) and path[0] == 0 and idx[b, m:].eq(-1).all()
            assert all(int(c["parents"][b, path[k]]) == path[k - 1] for k in range(1, m))
            if mode == "greedy":  # each accepted token is its parent's argmax
                assert all(int(c["tokens"][b, path[k]]) == int(c["target_logits"][b, path[k - 1]].argmax())
                           for k in range(1, m))
        assert lens.float().mean() > 1.2  # the cases are built to accept something


def test_outputs_are_deterministic_given_the_uniforms():
    c = random_verify_case(9, 20, 100, generator=torch.Generator().manual_seed(1))
    assert_same(_run("mss", c), _run("mss", c), I32)


def test_check_false_garbage_is_safe_and_identical_on_every_backend(device):
    # Malformed parents, tokens outside [0, V), NaN / negative rows, uniforms outside [0, 1):
    # no crash, a well-formed result, and the same result everywhere.
    g = torch.Generator().manual_seed(11)
    B, T, V = 5, 12, 9
    c = random_verify_case(B, T, V, generator=g, device=device)
    for name, at, value in (("parents", (1, 3), 7), ("parents", (2, 0), 4), ("tokens", (0, 2), -3),
                            ("tokens", (3, 1), V + 2), ("target_probs", (0, 0, 1), torch.nan),
                            ("draft_probs", (1, 2, 0), -0.5), ("uniforms", (2, 1, 0), 1.5),
                            ("uniforms", (4, 0, 1), torch.nan), ("num_nodes", 2, 99)):
        c[name][at] = value
    backends = [b for b in _backend.BACKENDS if _backend.available(b, device)[0]]
    for mode in MODES:
        want = _run(mode, c, backend="torch", check=False)
        assert ((want[2] >= 0) & (want[2] < V)).all() and (want[1] >= 1).all()
        for name in backends[1:]:
            assert_same(_run(mode, c, backend=name, check=False), want, I32)


# ---- R1 under a grammar: the bitmask fused into the walk (issue #33) ------------------------------

def _masked_case(B, T, V, device, dtype, seed):
    """A greedy case whose bitmask often disallows the row's argmax, with NaN and +inf planted at
    disallowed tokens (the mask turns them into -inf, so check=True accepts them)."""
    c = _case(B, T, V, "cpu")
    g = torch.Generator().manual_seed(seed)
    logits = c["target_logits"].to(dtype)
    allowed = torch.rand(B, T, V, generator=g) < 0.4
    allowed.scatter_(-1, torch.randint(0, V, (B, T, 1), generator=g), True)  # every row allows a token
    top = logits.float().argmax(-1, keepdim=True)
    allowed.scatter_(-1, top, torch.rand(B, T, 1, generator=g) < 0.3)  # the argmax mostly masked out
    allowed.scatter_(-1, torch.randint(0, V, (B, T, 1), generator=g), True)
    weird = ~allowed & (torch.rand(B, T, V, generator=g) < 0.1)
    logits = logits.masked_fill(weird, float("nan")).masked_fill(weird & (torch.rand(B, T, V, generator=g) < 0.5),
                                                                 float("inf"))
    tokens = c["tokens"].clone()
    # children that carry the masked argmax of their parent, so that masked walks go deep
    masked_top = torch.where(allowed, logits.float().nan_to_num(nan=-1e9, posinf=-1e9), -torch.inf).argmax(-1)
    for b in range(B):
        for i in range(1, int(c["num_nodes"][b])):
            p = int(c["parents"][b, i])
            if 0 <= p < i and torch.rand((), generator=g) < 0.5:
                tokens[b, i] = masked_top[b, p]
    args = [tokens, c["parents"], logits, c["num_nodes"], specops.pack_mask(allowed)]
    return [a.to(device) for a in args], logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_bitmask_equals_greedy_on_masked_logits(backend, device, dtype):
    for i, (B, T, V) in enumerate([(1, 1, 1), (2, 5, 33), (3, 7, 70), (2, 9, 1000), (1, 4, 32000)]):
        (tok, par, logits, nn, mask), cpu_logits = _masked_case(B, T, V, device, dtype, seed=i)
        masked = specops.apply_token_bitmask(cpu_logits.clone(), mask.cpu())
        want = specops.verify_greedy(tok.cpu(), par.cpu(), masked, nn.cpu(), backend="torch")
        got = specops.verify_greedy(tok, par, logits, nn, bitmask=mask, backend=backend)
        assert_same(got, want, I32)
        assert got[1].float().mean() > 1 or T == 1  # the masked argmax was followed


def test_greedy_bitmask_row_allowing_nothing_is_safe_unchecked(backend, device):
    # checked, it is an error (tests/test_bad_input.py); check=False must not crash
    (tok, par, logits, nn, mask), _ = _masked_case(2, 5, 33, device, torch.float32, seed=9)
    mask[1, 2] = 0
    _, lens, bonus = specops.verify_greedy(tok, par, logits, nn, bitmask=mask, check=False, backend=backend)
    assert (lens >= 1).all() and ((bonus >= 0) & (bonus < 33)).all()


# ---- registration --------------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("mode", MODES)
def test_opcheck_verify_tree(mode):
    c = random_verify_case(3, 9, 13, generator=torch.Generator().manual_seed(6))
    torch.library.opcheck(torch.ops.specops.verify_tree.default,
                          (c["tokens"], c["parents"], c["target_probs"], c["uniforms"],
                           c["draft_probs"] if mode != "mss_pointmass" else None, c["num_nodes"], mode))


@needs_cpp
def test_opcheck_verify_greedy_and_joint():
    c = random_verify_case(3, 9, 13, generator=torch.Generator().manual_seed(7))
    mask = specops.pack_mask(torch.rand(3, 9, 13, generator=torch.Generator().manual_seed(8)) < 0.5)
    tree, x, n = (c["tokens"], c["parents"]), c["target_logits"], c["num_nodes"]
    for args in [(*tree, x, n), (*tree, x.bfloat16(), n), (*tree, x, n, mask)]:
        torch.library.opcheck(torch.ops.specops.verify_greedy.default, args)
    tokens, lp, lq, u = _joint_args(c)
    log_tau = torch.log(torch.full((3,), 0.3))
    torch.library.opcheck(torch.ops.specops.verify_joint.default, (tokens, lp, lq, log_tau, u))


@needs_cpp
def test_torch_compile_fullgraph():
    c = random_verify_case(4, 12, 50, generator=torch.Generator().manual_seed(8))

    def step(tok, par, P, U, Q, n, logits, jt, lp, lq, ju):
        idx, lens, bonus = specops.verify_tree(tok, par, P, U, draft_probs=Q, mode="mss", num_nodes=n,
                                               check=False, backend="cpp")
        gidx, glens, gbonus = specops.verify_greedy(tok, par, logits, n, check=False, backend="cpp")
        jidx, jlens, jbonus = specops.verify_joint(jt, lp, lq, 0.3, ju, check=False, backend="cpp")
        return idx, lens + glens, bonus * 2, gidx, gbonus, jidx, jlens, jbonus

    args = (c["tokens"], c["parents"], c["target_probs"], c["uniforms"], c["draft_probs"], c["num_nodes"],
            c["target_logits"], *_joint_args(c))
    assert_same(torch.compile(step, fullgraph=True)(*args), step(*args))
