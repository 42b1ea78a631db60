"""Bad input to every public op, table-driven, on every backend: each case asserts the exception
type, that the message names the argument and shows the offending value (and position), and that
every tensor passed in is bit-identical afterwards. Valid but unusual layouts (strided, stride-0,
zero-size) must give what contiguous inputs give. The caches and generate: test_bad_input_state.py."""
import dataclasses

import pytest
import torch

import specops

from _op_args import gen, valid_args
from _op_checks import raises, to_device

I32, I64, F32, F64 = torch.int32, torch.int64, torch.float32, torch.float64
NAN, INF = float("nan"), float("inf")


# ---- the table -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    op: str
    label: str
    edit: object  # kwargs -> None (edits the dict in place)
    exc: type = None  # None: a valid call, compared with the same call on contiguous inputs
    shows: tuple = ()  # substrings of the message: the argument's name, the value, the position
    only: tuple = ()  # run on these backends only (others have no such limit)

    @property
    def id(self):
        return f"{self.op}-{self.label}"


def setv(arg, index, value):
    def edit(a):
        a[arg] = a[arg].clone()
        a[arg][index] = value
    return edit


def put(**kw):
    return lambda a: a.update({k: (v() if callable(v) else v) for k, v in kw.items()})


def puts(op, name, *values, exc=ValueError, rule=None):
    """A case per value: ``name=value`` raises ``exc`` whose message states the rule (by default, it
    names the argument) and shows the value ("got 1.5"; a TypeError also its type: "got str 'x'")."""
    got = (lambda v: f"got {type(v).__name__} {v!r}") if exc is TypeError else (lambda v: f"got {v!r}")
    return [Case(op, f"{name}={v!r}", put(**{name: v}), exc, (rule or f"{name} must", got(v))) for v in values]


def sets(op, name, *entries, got=False):
    """A case per (index, value): ``name[index] = value`` raises ValueError showing ``name[i, j] = value``
    (``got``: ``name[i, j]`` and ``got value``, as the tree rules say it)."""
    def case(index, value):
        at = f"{name}[{', '.join(map(str, index)) if isinstance(index, tuple) else index}]"
        shows = (at, f"got {value}") if got else (f"{at} = {value}",)
        return Case(op, f"{at}={value}", setv(name, index, value), V, shows)
    return [case(*e) for e in entries]


def grown(dim):  # one more entry along dim
    return lambda t: torch.cat([t, t.narrow(dim, 0, 1)], dim)


def edit(name, fn):  # name=fn(its valid value)
    return lambda a: a.update({name: fn(a[name])})


def relaid(name, d0=0, d1=1):  # the same values, dims d0 and d1 swapped in memory
    return edit(name, lambda t: t.transpose(d0, d1).contiguous().transpose(d0, d1))


def _shape(name):
    """The message must show the shape that came (computed from the edited arguments)."""
    return lambda a: str(tuple(a[name].shape))


V, E = ValueError, TypeError
# Metadata, generated per tensor argument: (name, a dtype it must not have, a dim whose size is
# fixed by another argument or None for the argument that fixes the sizes and the device, and for
# the page table, which fixes B).
META = {
    "warp_probs": [("logits", F64, None), ("temperature", I32, 0), ("top_k", F32, 0), ("top_p", I32, 0)],
    "build_tree_mask": [("parents", I64, None), ("num_nodes", I64, 0)],
    "tree_attention": [("q", F64, None), ("k_cache", F64, 0), ("v_cache", F64, 2), ("prefix_lens", I64, 0),
                       ("block_lens", I64, 0), ("mask", I64, 1), ("q_lens", I64, 0)],
    "kv_compact": [("k_cache", F64, None), ("v_cache", F64, 3), ("prefix_lens", I64, 0), ("accept_idx", I64, 0),
                   ("accept_lens", I64, 0)],
    "kv_compact_paged": [("k_pages", F64, None), ("v_pages", F64, 1), ("page_table", I64, None),
                         ("prefix_lens", I64, 0), ("accept_idx", I64, 0), ("accept_lens", I64, 0)],
    "verify_greedy": [("tokens", I64, None), ("parents", I64, 1), ("target_logits", F64, 1), ("num_nodes", I64, 0)],
    "verify_tree": [("tokens", I64, None), ("parents", I64, 1), ("target_probs", F64, 1), ("uniforms", F64, 2),
                    ("draft_probs", F64, 2), ("num_nodes", I64, 0)],
    "verify_tree_logits": [("tokens", I64, None), ("parents", I64, 1), ("target_logits", F64, 1),
                           ("uniforms", F64, 2), ("draft_logits", F64, 2), ("num_nodes", I64, 0), ("temperature", I32, 0),
                           ("top_k", F32, 0), ("top_p", I32, 0), ("draft_temperature", I32, 0),
                           ("draft_top_k", F32, 0), ("draft_top_p", I32, 0)],
    "verify_joint": [("draft_tokens", I64, None), ("target_logprobs", F64, 1), ("draft_joint_logprobs", F64, 1),
                     ("tau", F64, 0), ("uniforms", F64, 0)],
    "verify_joint_logits": [("draft_tokens", I64, None), ("target_logits", F64, 1), ("draft_joint_logprobs", F64, 1),
                            ("tau", F64, 0), ("uniforms", F64, 0), ("num_nodes", I64, 0), ("temperature", I32, 0),
                            ("top_k", F32, 0), ("top_p", I32, 0), ("bonus_temperature", I32, 0),
                            ("bonus_top_k", F32, 0), ("bonus_top_p", I32, 0)],
    "apply_token_bitmask": [("logits", F64, None), ("bitmask", I64, 2)],
    "verify_greedy[bitmask]": [("bitmask", I64, 2)],
    "verify_tree_logits[bitmask]": [("bitmask", I64, 2)],
    "topn_expand": [("parent_scores", F64, None), ("child_logprobs", F64, 1)],
    "select_topn_subtree": [("parents", I64, None), ("scores", F64, 1), ("num_nodes", I64, 0)],
}


def _meta_cases():
    for op, args in META.items():
        for name, dtype, dim in args:
            m = f"{name} must "  # the rule the message states, then what came
            scalar_too = name.endswith(("temperature", "top_k", "top_p", "tau"))  # sampling parameters
            yield Case(op, f"{name}-list", edit(name, torch.Tensor.tolist), E,
                       (m + ("be a" if scalar_too else "be a torch.Tensor"), "list"))
            yield Case(op, f"{name}-{dtype}", edit(name, lambda t, d=dtype: t.to(d)), E,
                       (m + "have dtype", str(dtype)))
            yield Case(op, f"{name}-rank", edit(name, lambda t: t[None]), V, (m + "have rank", _shape(name)))
            if dim is not None:
                yield Case(op, f"{name}-device", edit(name, lambda t: t.to("meta")), V, (m + "be on", "meta"))
                yield Case(op, f"{name}-shape", edit(name, grown(dim)), V, (m + "have shape", _shape(name)))


W, TM, TA, KV, VG, VT, VJ, TN, ST = ("warp_probs", "build_tree_mask", "tree_attention", "kv_compact", "verify_greedy",
                                     "verify_tree", "verify_joint", "topn_expand", "select_topn_subtree")
MAX_N = "n must be <= 65536 (MAX_N"
VGB, VLB, LN, LNP = "verify_greedy[bitmask]", "verify_tree_logits[bitmask]", "linear", "linear[packed]"
VL, VJL, TB, KVP = "verify_tree_logits", "verify_joint_logits", "apply_token_bitmask", "kv_compact_paged"
COMPILED = ("cpp", "cuda", "triton", "cudasim")
VALUES = [
    # warp_probs: values under check=True, scalar parameters, limits
    Case(W, "logits-nan", setv("logits", (1, 3), NAN), V, ("logits", "nan", "[1, 3]")),
    Case(W, "logits-inf", setv("logits", (0, 2), INF), V, ("logits", "inf", "[0, 2]")),
    Case(W, "logits-row-all-minus-inf", setv("logits", 1, -INF), V, ("logits row 1", "-inf")),
    *sets(W, "temperature", (1, -1.0), (0, NAN), (1, INF)), *sets(W, "top_k", (1, -2)),
    *sets(W, "top_p", (0, 0.0), (1, 1.5), (0, NAN)),
    *puts(W, "temperature", -0.5, NAN, INF), *puts(W, "temperature", "hot", True, exc=E), *puts(W, "top_k", -1),
    *puts(W, "top_k", 2.5, True, exc=E), *puts(W, "top_p", 0.0, 1.5, NAN), *puts(W, "top_p", "x", exc=E),
    Case(W, "V=0", put(logits=lambda: torch.zeros(2, 0)), V, ("logits", "(2, 0)")),
    Case(W, "logits-int64", put(logits=lambda: torch.zeros(2, 7, dtype=I64)), E, ("logits", "torch.int64")),
    Case(W, "V-over-int32", put(logits=lambda: torch.zeros(2, 1).expand(2, 2**31)), V,
         ("V=2147483648", "2147483647"), only=COMPILED),
    # build_tree_mask
    *sets(TM, "parents", ((1, 0), 0), ((0, 3), 3), ((0, 2), -1), ((0, 4), 7), got=True),
    *sets(TM, "num_nodes", (1, 0), (1, -3)),
    Case(TM, "num_nodes-past-t", setv("num_nodes", 0, 6), V, ("num_nodes[0] = 6", "T=5")),
    Case(TM, "T=0", put(parents=lambda: torch.zeros(2, 0, dtype=I32), num_nodes=None), V, ("parents", "(2, 0)")),
    # tree_attention
    *sets(TA, "prefix_lens", (1, -1)), *sets(TA, "block_lens", (0, -2)), *sets(TA, "q_lens", (0, -1)),
    Case(TA, "block_lens-past-mask", setv("block_lens", 1, 33), V, ("block_lens[1] = 33", "W=1")),
    Case(TA, "lens-past-cache", setv("prefix_lens", 0, 14), V, ("prefix_lens + block_lens", "[0] = 17", "S = 16")),
    Case(TA, "q_lens-past-tq", setv("q_lens", 1, 4), V, ("q_lens[1] = 4", "Tq=3")),
    Case(TA, "sm_scale-nan", put(sm_scale=NAN), E, ("sm_scale", "nan")),
    Case(TA, "sm_scale-str", put(sm_scale="0.1"), E, ("sm_scale", "'0.1'")),
    Case(TA, "D=0", put(q=lambda: torch.zeros(2, 3, 4, 0), k_cache=lambda: torch.zeros(2, 2, 16, 0),
                        v_cache=lambda: torch.zeros(2, 2, 16, 0)), V, ("D", "D=0")),
    Case(TA, "heads-not-dividing", put(k_cache=lambda: torch.zeros(2, 3, 16, 8),
                                       v_cache=lambda: torch.zeros(2, 3, 16, 8)), V, ("Hq=4", "Hkv=3")),
    Case(TA, "k_cache-last-stride", put(k_cache=lambda: torch.zeros(2, 2, 8, 16).transpose(2, 3)), V,
         ("k_cache", "stride", "(256, 128, 1, 16)")),
    Case(TA, "D-over-cuda-limit", put(q=lambda: torch.zeros(2, 3, 4, 264), k_cache=lambda: torch.zeros(2, 2, 16, 264),
                                      v_cache=lambda: torch.zeros(2, 2, 16, 264)), V, ("D=264", "256"),
         only=("cuda", "cudasim")),
    Case(TA, "B*Hkv-over-cuda-limit", put(
        q=lambda: torch.zeros(16384, 1, 4, 8), k_cache=lambda: torch.zeros(16384, 4, 1, 8),
        v_cache=lambda: torch.zeros(16384, 4, 1, 8), prefix_lens=lambda: torch.zeros(16384, dtype=I32),
        block_lens=lambda: torch.zeros(16384, dtype=I32), q_lens=None,
        mask=lambda: torch.zeros(16384, 1, 1, dtype=I32)),
        V, ("B=16384", "Hkv=4", "65535"), only=("cuda", "cudasim")),
    # kv_compact: values, aliasing, strides
    Case(KV, "accept_lens-past-a", setv("accept_lens", 0, 4), V,
         ("accept_lens must lie in [0, A=3], got accept_lens[0] = 4",)),
    Case(KV, "accept_lens-negative", setv("accept_lens", 1, -1), V,
         ("accept_lens must lie in [0, A=3]", "accept_lens[1] = -1")),
    Case(KV, "prefix_lens-past-s", setv("prefix_lens", 1, 17), V,
         ("prefix_lens must lie in [0, S=16]", "prefix_lens[1] = 17")),
    Case(KV, "prefix_lens-negative", setv("prefix_lens", 0, -1), V,
         ("prefix_lens must lie in [0, S=16]", "prefix_lens[0] = -1")),
    Case(KV, "accept_idx-not-increasing", setv("accept_idx", (0, 2), 2), V,
         ("accept_idx[0, 2] must be > accept_idx[0, 1] = 2, got 2",)),
    Case(KV, "accept_idx-decreasing", setv("accept_idx", (0, 2), 1), V,
         ("accept_idx[0, 2] must be > accept_idx[0, 1] = 2, got 1",)),
    Case(KV, "accept_idx-negative", setv("accept_idx", (1, 0), -1), V,
         ("accept_idx[1, 0] must be >= 0, got -1",)),
    Case(KV, "accept_idx-past-s", setv("accept_idx", (1, 1), 12), V,
         ("accept_idx[1, 1] = 12 plus prefix_lens[1] = 5 must address a row < S=16",)),
    Case(KV, "k_cache-last-stride", relaid("k_cache", 3, 4), V,
         ("k_cache must have stride 1 in its last dimension",)),
    Case(KV, "v-is-k", lambda a: a.update(v_cache=a["k_cache"]), V,
         ("v_cache must not share memory with k_cache", "0 bytes apart")),
    Case(KV, "v-is-a-view-of-k", lambda a: a.update(v_cache=a["k_cache"].transpose(1, 1)), V,
         ("v_cache must not share memory with k_cache",)),
    Case(KV, "v-overlaps-k", lambda a: a.update(zip(("k_cache", "v_cache"), _overlapping())), V,
         ("v_cache", "8 bytes apart")),
    Case(KV, "k-expanded", put(k_cache=lambda: torch.zeros(2, 2, 2, 1, 4).expand(2, 2, 2, 16, 4)), V,
         ("k_cache must not address one element twice", "(16, 8, 4, 0, 1)")),
    Case(KV, "v-expanded", put(v_cache=lambda: torch.zeros(1, 2, 2, 16, 4).expand(2, 2, 2, 16, 4)), V,
         ("v_cache", "address one element twice")),
    # kv_compact_paged: the pool, the page table (a page a move writes is addressed once) and the values
    Case(KVP, "page_size-3", edit("k_pages", lambda t: t[:, :, :3]), V,
         ("k_pages page_size (dim 2) must be a power of two",)),
    Case(KVP, "v-is-k", lambda a: a.update(v_pages=a["k_pages"]), V,
         ("v_pages must not share memory with k_pages",)),
    Case(KVP, "k-expanded", edit("k_pages", lambda t: t[:, :1].expand(2, 6, 4, 3, 4)), V,
         ("k_pages must not address one element twice",)),
    Case(KVP, "page_table-one-row", put(page_table=lambda: torch.tensor([[5, 0, 2]], dtype=I32)), V,
         ("prefix_lens must have shape [1]",)),
    Case(KVP, "page-past-pool", setv("page_table", (0, 1), 6), V,
         ("page_table[0, 1] must lie in [0, num_pages=6) (page 1 holds rows [4, 8) of sequence 0, which",
          "uses 6 rows), got 6")),
    Case(KVP, "page-negative", setv("page_table", (1, 1), -1), V,
         ("page_table[1, 1] must lie in [0, num_pages=6)",)),
    # sequence 1's page 1 is sequence 0's page 1, which both write
    Case(KVP, "written-page-shared", setv("page_table", (0, 1), 3), V,
         ("page_table[0, 1] = 3 holds rows the compaction writes (rows [4, 8) of sequence 0), so it must",
          "be no other entry the moves address, got page_table[1, 1] = 3 too")),
    # a written page that is also sequence 1's prefix page 0 (read only there: still refused)
    Case(KVP, "written-page-read-elsewhere", setv("page_table", (0, 1), 1), V,
         ("page_table[0, 1] = 1 holds rows", "got page_table[1, 0] = 1 too")),
    # one sequence listing the written page twice
    Case(KVP, "written-page-twice", setv("page_table", (0, 0), 0), V,
         ("page_table[0, 1] = 0 holds rows", "got page_table[0, 0] = 0 too")),
    Case(KVP, "prefix_lens-past-pages", setv("prefix_lens", 1, 13), V,
         ("prefix_lens must lie in [0, max_pages * page_size = 12]",)),
    Case(KVP, "accept_idx-not-increasing", setv("accept_idx", (0, 2), 1), V,
         ("accept_idx[0, 2] must be > accept_idx[0, 1] = 1",)),
    Case(KVP, "accept_idx-past-pages", setv("accept_idx", (0, 2), 10), V,
         ("accept_idx[0, 2] = 10 plus prefix_lens[0] = 2 must address a row < max_pages * page_size = 12",)),
    Case(KVP, "accept_lens-past-a", setv("accept_lens", 0, 4), V, ("accept_lens must lie in [0, A=3]",)),
    # verify_greedy / verify_tree / verify_joint
    Case(VG, "tokens-past-v", setv("tokens", (0, 2), 6), V, ("tokens[0, 2]", "V=6", "got 6")),
    *sets(VG, "tokens", ((1, 1), -1), got=True), *sets(VG, "parents", ((1, 0), 0), ((0, 3), 5), got=True),
    *sets(VG, "num_nodes", (0, 0)), *sets(VG, "target_logits", ((1, 2, 4), NAN), ((0, 0, 0), INF)),
    Case(VG, "num_nodes-past-t", setv("num_nodes", 1, 5), V, ("num_nodes[1] = 5", "T=4")),
    Case(VG, "T=0", put(tokens=lambda: torch.zeros(2, 0, dtype=I32), parents=lambda: torch.zeros(2, 0, dtype=I32),
                        target_logits=lambda: torch.zeros(2, 0, 6), num_nodes=None), V, ("tokens", "(2, 0)")),
    Case(VG, "V=0", put(target_logits=lambda: torch.zeros(2, 4, 0)), V, ("target_logits", "(2, 4, 0)")),
    Case(VG, "logits-int32", edit("target_logits", torch.Tensor.int), E, ("target_logits", "torch.int32")),
    *sets(VT, "uniforms", ((0, 1, 0), 1.0), ((1, 3, 1), NAN), ((0, 0, 1), -0.5)),
    *sets(VT, "target_probs", ((0, 1, 0), -0.25)),
    *sets(VT, "draft_probs", ((0, 2, 1), INF), ((1, 2, 2), -0.25)), *sets(VT, "num_nodes", (0, 7), (1, 0)),
    Case(VT, "target-nan", setv("target_probs", (1, 2, 3), NAN), V, ("target_probs[1, 2]", "[1, 2, 3] = nan")),
    Case(VT, "target-sum", lambda a: a.update(target_probs=a["target_probs"] * 2), V, ("target_probs[0, 0]", "got 2")),
    Case(VT, "draft-zero-row", setv("draft_probs", (1, 2), 0.0), V, ("draft_probs[1, 2]", "got 0")),
    Case(VT, "mode-greedy", put(mode="greedy"), V, ("mode", "'greedy'")),
    Case(VT, "mode-none", put(mode=None), V, ("mode", "None")),
    Case(VT, "draft-missing", put(draft_probs=None), V, ("draft_probs", "mode='mss'")),
    *sets(VT, "tokens", ((0, 3), 6), ((1, 2), -1), got=True),
    *sets(VT, "parents", ((0, 2), 2), ((0, 0), 0), got=True),
    Case(VL, "tokens-past-v", setv("tokens", (0, 3), 6), V, ("tokens[0, 3]", "V=6", "got 6")),
    *sets(VL, "parents", ((1, 2), 2), got=True),
    *sets(VL, "num_nodes", (1, 0)), *sets(VL, "uniforms", ((1, 1, 0), 1.0), ((0, 2, 1), NAN)),
    *sets(VL, "target_logits", ((1, 2, 3), NAN), ((0, 0, 5), INF)),
    *sets(VL, "draft_logits", ((0, 2, 4), NAN)), *sets(VL, "temperature", (1, NAN)),
    *sets(VL, "top_p", (0, 1.5)), *sets(VL, "draft_top_k", (1, -2)),
    Case(VL, "target-row-all-minus-inf", setv("target_logits", (1, 1), -INF), V,
         ("target_logits[1, 1]", "at least one finite value", "all -inf")),
    Case(VL, "draft-row-all-minus-inf", setv("draft_logits", (0, 3), -INF), V, ("draft_logits[0, 3]", "all -inf")),
    Case(VL, "draft-missing", put(draft_logits=None), V, ("draft_logits", "mode='mss'")),
    Case(VL, "mode-greedy", put(mode="greedy"), V, ("mode", "'greedy'")),
    *puts(VL, "temperature", -0.5), *puts(VL, "temperature", "hot", exc=E), *puts(VL, "top_k", -1),
    *puts(VL, "top_p", 0.0), *puts(VL, "top_k", 2.5, exc=E), *puts(VL, "draft_temperature", INF),
    *puts(VL, "draft_top_p", 1.5), *puts(VL, "draft_top_p", True, exc=E),
    Case(VL, "T=0", lambda a: a.update(tokens=torch.zeros(2, 0, dtype=I32), parents=torch.zeros(2, 0, dtype=I32),
                                       target_logits=torch.zeros(2, 0, 6), uniforms=torch.zeros(2, 0, 2),
                                       draft_logits=torch.zeros(2, 0, 6), num_nodes=None), V, ("tokens", "(2, 0)")),
    Case(VL, "V=0", put(target_logits=lambda: torch.zeros(2, 4, 0), draft_logits=lambda: torch.zeros(2, 4, 0)), V,
         ("target_logits", "(2, 4, 0)")),
    Case(VL, "V-over-int32", put(target_logits=lambda: torch.zeros(2, 4, 1).expand(2, 4, 2**31),
                                 draft_logits=lambda: torch.zeros(2, 4, 1).expand(2, 4, 2**31)), V,
         ("target_logits", "V=2147483648"), only=COMPILED),
    Case(VJ, "tokens-past-v", setv("draft_tokens", (1, 2), 6), V, ("draft_tokens", "6 at [1, 2]")),
    Case(VJ, "tokens-negative", setv("draft_tokens", (0, 0), -1), V, ("draft_tokens", "-1 at [0, 0]")),
    *puts(VJ, "tau", 1.5, -0.25, NAN, rule="tau must lie in [0, 1]"), *puts(VJ, "tau", "0.5", exc=E),
    *sets(VJ, "tau", (1, -0.25), (0, NAN)), *sets(VJ, "uniforms", (1, 1.0), (0, NAN)),
    *sets(VJ, "target_logprobs", ((0, 1, 2), NAN), ((1, 3, 0), INF)),
    *sets(VJ, "draft_joint_logprobs", ((0, 1), 0.5), ((1, 0), NAN)),
    Case(VJ, "target-not-normalised", edit("target_logprobs", lambda t: t + 1), V,
         ("target_logprobs[0, 0]", "got 1")),
    Case(VJ, "V=0", put(target_logprobs=lambda: torch.zeros(2, 4, 0)), V, ("target_logprobs", "(2, 4, 0)")),
    # verify_greedy / verify_tree_logits under a grammar bitmask (a disallowed token's NaN / +inf is valid)
    Case(VGB, "nan-at-an-allowed-token", setv("target_logits", (1, 2, 4), NAN), V,
         ("target_logits[1, 2] must not contain NaN or +inf",)),
    Case(VGB, "row-allows-no-token", setv("bitmask", (1, 2), 0), V,
         ("bitmask[1, 2] must allow at least one of the V=6 tokens",)),
    Case(VLB, "target-nan-at-an-allowed-token", setv("target_logits", (1, 2, 3), NAN), V,
         ("target_logits must not contain NaN or +inf", "[1, 2, 3]")),
    Case(VLB, "draft-inf-at-an-allowed-token", setv("draft_logits", (1, 2, 0), INF), V,
         ("draft_logits must not contain NaN or +inf", "[1, 2, 0]")),
    Case(VLB, "row-allows-no-token", setv("bitmask", (1, 2), 0), V,
         ("bitmask[1, 2] must allow at least one of the V=6 tokens",)),
    Case(VLB, "no-mask-so-the-planted-values-count", put(bitmask=None), V,
         ("target_logits must not contain NaN or +inf",)),
    # verify_joint_logits
    *puts(VJL, "tau", 1.5, rule="tau must lie in [0, 1]"), *puts(VJL, "tau", "x", exc=E),
    *puts(VJL, "temperature", -1.0), *puts(VJL, "bonus_top_p", 0.0), *puts(VJL, "bonus_top_k", 1.5, exc=E),
    Case(VJL, "tau-tensor-nan", setv("tau", 1, NAN), V, ("tau must lie in [0, 1]", "nan")),
    Case(VJL, "num_nodes-past-g+1", setv("num_nodes", 1, 5), V, ("num_nodes must lie in [1, g + 1 = 4]",
                                                                 "num_nodes[1] = 5")),
    Case(VJL, "tokens-past-v", setv("draft_tokens", (0, 2), 6), V, ("draft_tokens must lie in [0, V=6)",
                                                                    "draft_tokens[0, 2] = 6")),
    Case(VJL, "uniform-one", setv("uniforms", 0, 1.0), V, ("uniforms must lie in [0, 1)", "uniforms[0] = 1.0")),
    Case(VJL, "joint-positive", setv("draft_joint_logprobs", (0, 2), 0.5), V,
         ("draft_joint_logprobs must be log-probabilities (<= 0, not NaN)", "draft_joint_logprobs[0, 2] = 0.5")),
    Case(VJL, "target-nan", setv("target_logits", (1, 1, 4), NAN), V,
         ("target_logits must not contain NaN or +inf", "target_logits[1, 1, 4] = nan")),
    Case(VJL, "target-row-all-minus-inf", setv("target_logits", (0, 2), -INF), V,
         ("target_logits[0, 2] must have at least one finite value",)),
    # apply_token_bitmask (in place: a rejected call writes nothing)
    Case(TB, "logits-int32", put(logits=lambda: torch.zeros(2, 3, 40, dtype=I32)), E, ("logits", "torch.int32")),
    Case(TB, "rank-1", lambda a: a.update(logits=a["logits"][0, 0], bitmask=a["bitmask"][0, 0]), V,
         ("logits must have rank 2 ([N, V]) or 3", "(40,)")),
    Case(TB, "V=0", put(logits=lambda: torch.zeros(2, 3, 0), bitmask=lambda: torch.zeros(2, 3, 0, dtype=I32)), V,
         ("at least one token (V >= 1)",)),
    Case(TB, "logits-strided-v", put(logits=lambda: torch.zeros(2, 3, 80)[..., ::2]), V,
         ("logits must have stride 1 in its last dimension",)),
    Case(TB, "bitmask-rank-2", lambda a: a.update(bitmask=a["bitmask"][0]), V, ("bitmask must have rank 3",)),
    Case(TB, "bitmask-one-word-short", lambda a: a.update(bitmask=a["bitmask"][..., :1]), V,
         ("bitmask must have shape [2, 3, 2], got (2, 3, 1)",)),
    Case(TB, "bitmask-rows-differ", lambda a: a.update(bitmask=a["bitmask"][:, :2]), V,
         ("bitmask must have shape [2, 3, 2], got (2, 2, 2)",)),
    Case(TB, "empty-row", setv("bitmask", (0, 1), 0), V, ("bitmask[0, 1] must allow at least one of the V=40 tokens",)),
    Case(TB, "only-tail-bits", put(logits=lambda: torch.zeros(4, 33),
                                   bitmask=lambda: torch.tensor([[1, 0]] * 3 + [[0, -2]], dtype=I32)), V,
         ("bitmask[3] must allow at least one of the V=33 tokens",)),
    # topn_expand / select_topn_subtree
    *sets(TN, "parent_scores", ((1, 0), NAN), ((0, 2), INF)),
    *sets(TN, "child_logprobs", ((1, 2, 3), NAN), ((0, 0, 6), INF)),
    *puts(TN, "n", 0, -3, rule="n must be >= 1"), *puts(TN, "n", 2**62, 2**31 - 1, 65537, 2**31, rule=MAX_N),
    *puts(TN, "n", 2.0, True, "4", exc=E), *puts(TN, "per_parent_k", 0, -1), *puts(TN, "per_parent_k", 1.5, exc=E),
    Case(TN, "parent_scores-int64", edit("parent_scores", torch.Tensor.long), E,
         ("parent_scores", "torch.int64")),
    Case(TN, "child_logprobs-int32", edit("child_logprobs", torch.Tensor.int), E,
         ("child_logprobs", "torch.int32")),
    Case(TN, "P=0", put(parent_scores=lambda: torch.zeros(2, 0), child_logprobs=lambda: torch.zeros(2, 0, 7)), V,
         ("child_logprobs", "(2, 0, 7)")),
    Case(TN, "V=0", put(child_logprobs=lambda: torch.zeros(2, 3, 0)), V, ("child_logprobs", "(2, 3, 0)")),
    Case(TN, "V-over-int32", put(child_logprobs=lambda: torch.zeros(2, 3, 1).expand(2, 3, 2**31)), V,
         ("child_logprobs", "V=2147483648")),
    *sets(ST, "parents", ((0, 0), -2), ((1, 3), 3), got=True),
    *sets(ST, "num_nodes", (1, 0), (0, 6)),
    *puts(ST, "n", 0), *puts(ST, "n", 2**62, 65537, 2**31, 2**31 - 1, rule=MAX_N),
    *puts(ST, "n", 1.5, None, "2", exc=E),
    Case(ST, "scores-int64", lambda a: a.update(scores=a["scores"].long()), E, ("scores", "torch.int64")),
    Case(ST, "T=0", put(parents=lambda: torch.zeros(2, 0, dtype=I32), scores=lambda: torch.zeros(2, 0), num_nodes=None),
         V, ("parents", "(2, 0)")),
    # linear (x [3, 5], weight [4, 5], bias [4]); linear[packed]: bf16, with pack_weight's copy of the weight
    Case(LN, "x-numpy", edit("x", torch.Tensor.numpy), E, ("x", "torch.Tensor")),
    Case(LN, "x-int64", edit("x", torch.Tensor.long), E, ("x", "dtype", "int64")),
    Case(LN, "x-rank-0", put(x=lambda: torch.tensor(1.0)), V, ("x", "rank >= 1")),
    Case(LN, "weight-float16", edit("weight", torch.Tensor.half), E, ("weight", "dtype", "float16")),
    Case(LN, "weight-short-k", edit("weight", lambda t: t[:, :3]), V, ("weight", "[N, K=5]", "(4, 3)")),
    Case(LN, "weight-rank-1", edit("weight", lambda t: t[0]), V, ("weight", "rank 2")),
    Case(LN, "bias-short", edit("bias", lambda t: t[:2]), V, ("bias", "[4]", "(2,)")),
    Case(LN, "bias-float64", edit("bias", torch.Tensor.double), E, ("bias", "float64")),
    Case(LN, "K=0", lambda a: a.update(x=a["x"][:, :0], weight=a["weight"][:, :0], bias=None), V,
         ("K >= 1", "K=0")),
    Case(LNP, "packed-half", edit("packed", lambda t: t[:, :, :64]), V,
         ("packed", "[1, 1, 128]", "(1, 1, 64)")),
    Case(LNP, "packed-float32", edit("packed", torch.Tensor.float), E, ("packed", "bfloat16", "float32")),
    Case(LNP, "packed-list", edit("packed", torch.Tensor.tolist), E, ("packed", "torch.Tensor")),
]


def _overlapping():
    base = torch.randn(2, 2, 2, 16, 6, generator=gen())
    return base[..., :4], base[..., 2:]


def _strided(values, dtype=I32):
    return torch.tensor([x for v in values for x in (v, 99)], dtype=dtype)[::2]


def _stride0(value, n=2, dtype=I32):
    return torch.tensor([value], dtype=dtype).expand(n)


def _t(shape, perm):  # a non-contiguous tensor of `shape` with the same values pattern
    inv = [perm.index(i) for i in range(len(perm))]
    return torch.randn(*[shape[p] for p in perm], generator=gen()).permute(*inv)


VALID = [
    Case(W, "logits-transposed", put(logits=lambda: _t((2, 7), [1, 0]))),
    Case(W, "logits-row-stride", put(logits=lambda: torch.randn(2, 3, 7, generator=gen())[:, 1])),
    Case(W, "temperature-strided", put(temperature=lambda: _strided([0.5, 2.0], F32))),
    Case(W, "top_k-stride0", put(top_k=lambda: _stride0(2))),
    Case(W, "top_p-stride0", put(top_p=lambda: _stride0(0.5, dtype=F32))),
    Case(W, "N=0", put(logits=lambda: torch.zeros(0, 7), temperature=1.0, top_k=2, top_p=0.5)),
    Case(TM, "parents-transposed", relaid("parents")),
    Case(TM, "num_nodes-strided", put(num_nodes=lambda: _strided([3, 5]))),
    Case(TM, "num_nodes-stride0", put(num_nodes=lambda: _stride0(4))),
    Case(TM, "B=0", put(parents=lambda: torch.zeros(0, 5, dtype=I32), num_nodes=None)),
    Case(TA, "prefix_lens-strided", put(prefix_lens=lambda: _strided([5, 7]))),
    Case(TA, "block_lens-strided", put(block_lens=lambda: _strided([3, 1]))),
    Case(TA, "q_lens-strided", put(q_lens=lambda: _strided([3, 1]))),
    Case(TA, "prefix_lens-stride0", put(prefix_lens=lambda: _stride0(6))),
    Case(TA, "q-permuted", put(q=lambda: _t((2, 3, 4, 8), [0, 2, 1, 3]))),
    Case(TA, "cache-slice-of-longer", lambda a: a.update(k_cache=torch.randn(2, 2, 20, 8, generator=gen())[:, :, 2:18],
                                                         v_cache=torch.randn(2, 2, 16, 8).flip(2))),
    Case(TA, "mask-transposed", relaid("mask", 1, 2)),
    Case(TA, "B=0", lambda a: a.update({k: v[:0] for k, v in a.items()})),
    Case(TA, "Tq=0", lambda a: a.update(q=a["q"][:, :0], mask=a["mask"][:, :0], q_lens=torch.zeros(2, dtype=I32))),
    Case(KV, "prefix_lens-strided", put(prefix_lens=lambda: _strided([1, 2]))),
    Case(KV, "accept_lens-stride0", put(accept_lens=lambda: _stride0(2))),
    Case(KV, "accept_idx-column-slice", put(accept_idx=lambda: torch.tensor([[0, 9, 2, 9, 3], [0, 9, 1, 9, 4]],
                                                                          dtype=I32)[:, ::2])),
    Case(KV, "kv-interleaved", lambda a: a.update(zip(("k_cache", "v_cache"),
                                                      torch.randn(2, 2, 2, 2, 16, 4, generator=gen()).unbind(1)))),
    Case(KV, "cache-slice-of-longer",
         lambda a: a.update(k_cache=torch.randn(2, 2, 2, 24, 4, generator=gen())[:, :, :, 4:20])),
    Case(KV, "A=0", lambda a: a.update(accept_idx=a["accept_idx"][:, :0], accept_lens=torch.zeros(2, dtype=I32))),
    Case(KV, "B=0", lambda a: a.update({k: v[:, :0] if "cache" in k else v[:0] for k, v in a.items()})),
    Case(VG, "num_nodes-strided", put(num_nodes=lambda: _strided([2, 4]))),
    Case(VG, "num_nodes-stride0", put(num_nodes=lambda: _stride0(3))),
    Case(VG, "logits-last-stride", relaid("target_logits", 1, 2)),
    Case(VG, "B=0", lambda a: a.update({k: v[:0] for k, v in a.items()})),
    Case(VT, "num_nodes-stride0", put(num_nodes=lambda: _stride0(4))),
    Case(VT, "padding-rows-may-hold-anything", lambda a: (setv("tokens", (1, 3), 99)(a),
                                                          setv("target_probs", (1, 3), NAN)(a))),
    Case(VT, "uniforms-transposed", relaid("uniforms", 0, 2)),
    Case(VT, "probs-last-stride", relaid("target_probs", 1, 2)),
    Case(VL, "padding-rows-may-hold-anything", lambda a: (setv("target_logits", (1, 3), NAN)(a),
                                                          setv("draft_logits", (0, 0), -INF)(a))),
    Case(VL, "scalar-parameters", put(temperature=0.8, top_k=2, top_p=0.7, draft_temperature=None, draft_top_k=0,
                                      draft_top_p=1.0)),
    Case(VL, "bf16-target-fp32-draft", lambda a: a.update(target_logits=a["target_logits"].bfloat16())),
    Case(VL, "logits-last-stride", relaid("target_logits", 1, 2)),
    Case(VL, "temperature-stride0", put(temperature=lambda: _stride0(0.5, dtype=F32))),
    Case(VL, "top_k-int64-strided", put(top_k=lambda: _strided([1, 4], I64))),
    Case(VL, "B=0", lambda a: a.update({k: v[:0] for k, v in a.items() if isinstance(v, torch.Tensor)})),
    Case(VGB, "nan-and-inf-at-disallowed-tokens", lambda a: None),
    Case(VLB, "nan-and-inf-at-disallowed-tokens", lambda a: None),
    Case(VJ, "tau-stride0", put(tau=lambda: _stride0(0.25, dtype=F32))),
    Case(VJ, "uniforms-strided", put(uniforms=lambda: _strided([0.5, 0.25], F32))),
    Case(VJ, "g=0", lambda a: a.update(draft_tokens=a["draft_tokens"][:, :0],
                                       target_logprobs=a["target_logprobs"][:, :1],
                                       draft_joint_logprobs=a["draft_joint_logprobs"][:, :0])),
    Case(TN, "child-transposed", relaid("child_logprobs", 1, 2)),
    Case(TN, "parent-strided", lambda a: a.update(parent_scores=torch.stack([a["parent_scores"]] * 2, -1)[..., 1])),
    Case(TN, "B=0", lambda a: a.update(parent_scores=a["parent_scores"][:0], child_logprobs=a["child_logprobs"][:0])),
    Case(ST, "num_nodes-strided", put(num_nodes=lambda: _strided([2, 5]))),
    Case(ST, "num_nodes-stride0", put(num_nodes=lambda: _stride0(3))),
    Case(ST, "scores-transposed", relaid("scores")),
    Case(ST, "B=0", lambda a: a.update(parents=a["parents"][:0], scores=a["scores"][:0], num_nodes=None)),
]
CASES = list(_meta_cases()) + VALUES + VALID


# ---- the runner --------------------------------------------------------------------------------------

def _assert_same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            assert torch.equal(g, w)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, backend, device):
    if case.only and backend not in case.only:
        pytest.skip(f"{case.id}: a limit of {', '.join(case.only)} only; {backend} has none")
    fn = getattr(specops, case.op.split("[")[0])
    args = valid_args(case.op)
    case.edit(args)
    args = to_device(args, device)
    if case.exc is None:  # valid: equal to the same call on contiguous copies
        ref = {k: v.clone(memory_format=torch.contiguous_format) if isinstance(v, torch.Tensor) else v
               for k, v in args.items()}
        got, want = fn(**args, backend=backend), fn(**ref, backend=backend)
        if got is None:  # kv_compact works in place: compare the caches
            got, want = (args["k_cache"], args["v_cache"]), (ref["k_cache"], ref["v_cache"])
        _assert_same(got, want)
        return
    shows = [part(args) if callable(part) else part for part in case.shows]
    inputs = [v for v in args.values() if isinstance(v, torch.Tensor) and v.device.type != "meta"]
    raises(case.exc, shows, lambda: fn(**args, backend=backend), *inputs)


def test_the_battery_is_large_and_covers_every_public_op():
    ops = {"warp_probs", "build_tree_mask", "tree_attention", "kv_compact", "kv_compact_paged",
           "verify_greedy", "verify_tree", "verify_tree_logits", "verify_joint", "verify_joint_logits",
           "topn_expand", "select_topn_subtree", "apply_token_bitmask", "linear"}
    assert {c.op.split("[")[0] for c in CASES} == ops and ops <= set(specops.__all__)
    assert len({c.id for c in CASES}) == len(CASES) >= 280
