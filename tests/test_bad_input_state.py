"""Bad input to the KV caches (StaticKVCache, PagedKVCache) and generate (both kv_layouts), table-driven,
on every backend (the ops: tests/test_bad_input.py). A case asserts the exception type, that the message
names the argument and shows the value, and that the cache's storage, lens and host-side state are
bit-identical afterwards; a generate case, that no model forward ran."""
import pytest
import torch

import specops
from specops.cache import PagedKVCache, StaticKVCache
from specops.testing import tiny_causal_lm

from _op_checks import raises

I32, I64 = torch.int32, torch.int64
NAN, INF = float("nan"), float("inf")
V, E = ValueError, TypeError
L, B, H, S, D = 2, 2, 2, 16, 4
PAGE = 4  # the paged cache: 4 scattered pages of 4 rows per sequence
LAYOUTS = ("contiguous", "paged")


def _cache(layout, device):
    g = torch.Generator().manual_seed(3)
    c = (StaticKVCache(L, B, H, S, D, device=device) if layout == "contiguous"
         else PagedKVCache(L, B, H, S, D, page_size=PAGE, device=device))
    for t in (c.layout.k, c.layout.v):
        t.copy_(torch.randn(t.shape, generator=g))
    c.commit(torch.tensor([6, 3], dtype=I32, device=device))
    return c


def rows(T=1, dtype=torch.float32, b=B, h=H, d=D):
    return torch.randn(b, h, T, d, dtype=torch.float32).to(dtype)


def lens(*v, dtype=I32):
    return torch.tensor(v, dtype=dtype)


def own_rows(c, name, layer, start, stop):
    """A [B, H, stop - start, D] view of the cache's own storage (rows, or page slots, start:stop)."""
    t = getattr(c.layout, name)[layer]
    return t[:B, start:stop].transpose(1, 2) if c.layout.is_paged else t[:, :, start:stop]


def _in_block(action, offset=0, n=2):
    def run(c):
        c.begin_block(offset, n)
        try:
            action(c)
        finally:
            c.end_block()
    return run


def _dev(x, c):  # CPU tensors of a case follow the cache to its device
    return x.to(c.device) if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x


def append(layer, k, v=None):
    return lambda c: c.append_block(layer, _dev(k, c), _dev(k if v is None else v, c))


def method(name, *args, **kw):
    return lambda c: getattr(c, name)(*(_dev(a, c) for a in args), **{k: _dev(x, c) for k, x in kw.items()})


def new(**kw):
    """The cache's own constructor (StaticKVCache or PagedKVCache) with ``kw`` changed."""
    def make(c):
        args = dict(num_layers=L, batch_size=B, num_kv_heads=H, max_len=S, head_dim=D)
        args.update({"page_size": PAGE} if c.layout.is_paged else {}, **kw)
        return type(c)(**args)
    return make


def calls(label, make, name, *values):
    """A case per value: the call ``make(value)`` raises TypeError naming ``name`` and showing the value."""
    return [(f"{label}-{name}={v!r}", make(v), E, (name, repr(v))) for v in values]


CACHE = [
    *calls("new", lambda v: new(dtype=v), "dtype", torch.int32, torch.float64, "fp32"),
    *calls("new", lambda v: new(head_dim=v), "head_dim", 4.0),
    *calls("new", lambda v: new(batch_size=v), "batch_size", True),
    *calls("new", lambda v: new(num_kv_heads=v), "num_kv_heads", "2"),
    ("num_layers-0", new(num_layers=0), V, ("sizes", "[0, 2, 2, 16, 4")),
    ("max_len-negative", new(max_len=-1), V, ("sizes", "[2, 2, 2, -1, 4")),
    ("begin-offset-negative", method("begin_block", -5, 2), V, ("offset", "-5")),
    ("begin-rows-negative", method("begin_block", 0, -3), V, ("rows", "-3")),
    ("begin-rows-zero", method("begin_block", 0, 0), V, ("rows", "got 0")),
    *calls("begin", lambda v: method("begin_block", v, 2), "offset", "1", True),
    *calls("begin", lambda v: method("begin_block", 0, v), "rows", 2.0),
    ("begin-overflow", method("begin_block", 0, 11), V, ("max_len=16", "6 rows", "11 more")),
    ("begin-offset-overflow", method("begin_block", 8, 3), V, ("max_len=16", "11 more")),
    ("layer-negative", append(-1, rows()), V, ("layer", "-1")),
    ("layer-past-end", append(2, rows()), V, ("layer", "num_layers=2", "got 2")),
    *calls("append", lambda v: append(v, rows()), "layer", "0", 1.0, None),
    ("layer-in-block", _in_block(append(5, rows(2))), V, ("layer", "got 5")),
    ("k-int32", append(0, rows(dtype=torch.int32)), E, ("k", "torch.int32")),
    ("k-float64", append(0, rows(dtype=torch.float64)), E, ("k", "torch.float64")),
    ("v-other-dtype", append(0, rows(), rows(dtype=torch.float16)), E, ("v", "torch.float16")),
    ("k-rank", append(0, rows()[0]), V, ("k", "(2, 1, 4)")),
    ("k-batch", append(0, rows(b=3)), V, ("k", "(3, 2, 1, 4)")),
    ("k-heads", append(0, rows(h=1)), V, ("k", "(2, 1, 1, 4)")),
    ("k-head-dim", append(0, rows(d=5)), V, ("k", "(2, 2, 1, 5)")),
    ("v-rows", append(0, rows(1), rows(2)), V, ("v", "(2, 2, 2, 4)")),
    ("k-meta", append(0, rows().to("meta"), rows()), V, ("k", "meta")),
    ("v-meta", append(0, rows(), rows().to("meta")), V, ("v", "meta")),
    ("k-list", append(0, rows().tolist()), E, ("k", "list")),
    ("v-none", lambda c: c.append_block(0, _dev(rows(), c), None), E, ("v", "NoneType")),
    ("k-no-rows", append(0, rows(0)), V, ("k", "(2, 2, 0, 4)")),
    ("k-view-of-cache", lambda c: c.append_block(0, own_rows(c, "k", 1, 0, 1), _dev(rows(), c)), V,
     ("k", "share memory")),
    ("v-view-of-cache", lambda c: c.append_block(0, _dev(rows(), c), own_rows(c, "v", 0, 3, 4)), V,
     ("v", "storage offset")),
    ("k-view-of-v-cache", lambda c: c.append_block(1, own_rows(c, "v", 0, 0, 2), own_rows(c, "v", 0, 2, 4)), V,
     ("k", "share memory")),
    ("block-rows-mismatch", _in_block(append(0, rows(1))), V, ("T=1", "2 rows")),
    ("plain-overflow", append(0, rows(11)), V, ("append_block", "max_len=16")),
    ("block-then-bad-k", _in_block(append(0, rows(2, dtype=torch.int32))), E, ("k", "torch.int32")),
    ("commit-past-max", method("commit", lens(40, 0)), V, ("counts[0]", "got 40", "max_len=16")),
    ("commit-negative", method("commit", lens(0, -9)), V, ("counts[1]", "got -9")),
    ("commit-one-past", method("commit", lens(11, 0)), V, ("counts[0]", "got 11", "[0, 10]")),
    ("commit-int64", method("commit", lens(1, 1, dtype=I64)), E, ("counts", "torch.int64")),
    ("commit-shape", method("commit", lens(1, 1, 1)), V, ("counts", "(3,)")),
    ("commit-list", method("commit", [1, 1]), E, ("counts", "list")),
    ("commit-meta", method("commit", lens(1, 1).to("meta")), V, ("counts", "meta")),
    ("commit-host-len", method("commit", lens(1, 1), host_counts=[1]), V, ("host_counts", "got 1")),
    ("commit-host-value", method("commit", lens(1, 1), host_counts=[1, 20]), V, ("counts[1]", "got 20")),
    ("truncate-grow", method("truncate", lens(7, 3)), V, ("new_lens[0] = 7", "lens[0] = 6")),
    ("truncate-negative", method("truncate", lens(-1, 0)), V, ("new_lens[0] = -1",)),
    ("truncate-int64", method("truncate", lens(1, 1, dtype=I64)), E, ("new_lens", "torch.int64")),
    ("truncate-shape", method("truncate", lens(1)), V, ("new_lens", "(1,)")),
    ("truncate-meta", method("truncate", lens(1, 1).to("meta")), V, ("new_lens", "meta")),
    *calls("crop", lambda v: method("crop", v), "tokens_to_remove", "1", 1.5, True, None),
    ("reorder-past-batch", method("reorder_cache", lens(0, 2, dtype=I64)), V, ("beam_idx[1] = 2",)),
    ("reorder-negative", method("reorder_cache", lens(-1, 0, dtype=I64)), V, ("beam_idx[0] = -1",)),
    ("reorder-float", method("reorder_cache", torch.tensor([0.0, 1.0])), E, ("beam_idx", "torch.float32")),
    ("reorder-shape", method("reorder_cache", lens(0, 1, 1)), V, ("beam_idx", "(3,)")),
    ("reorder-meta", method("reorder_cache", lens(0, 1).to("meta")), V, ("beam_idx", "meta")),
    ("reorder-list", method("reorder_cache", [1, 0]), E, ("beam_idx", "list")),
    ("compact-not-increasing", method("compact", lens([0, 2, 2], [0, 1, 2]), lens(3, 3)), V,
     ("accept_idx[0, 2]", "got 2")),
    ("compact-lens-past-a", method("compact", lens([0, 1, 2], [0, 1, 2]), lens(4, 0)), V, ("accept_lens[0] = 4",)),
    ("compact-int64", method("compact", lens([0, 1], [0, 1], dtype=I64), lens(2, 2)), E, ("accept_idx", "torch.int64")),
    ("compact-past-s", method("compact", lens([0, 12, 13], [0, 1, 2]), lens(3, 3)), V,
     ("accept_idx[0, 1] = 12", "16")),  # contiguous: S=16, paged: max_pages * page_size = 16
    ("compact-lens-shape", method("compact", lens([0, 1], [0, 1]), lens(2)), V, ("accept_lens", "(1,)")),
]


PAGED = [  # the paged cache's own arguments
    ("page_size-not-power-of-two", new(page_size=3), V, ("page_size", "3")),
    ("page_size-zero", new(page_size=0), V, ("sizes", "0]")),
    ("num_pages-too-few", new(num_pages=7), V, ("num_pages", "= 8", "got 7")),
    ("page_order-not-a-permutation", new(page_order=torch.zeros(8, dtype=I64)), V, ("page_order", "permutation")),
    ("page_order-float", new(page_order=torch.arange(8.0)), E, ("page_order", "torch.float32")),
]
CASES = [(*case, lay) for case in CACHE for lay in LAYOUTS] + [(*case, "paged") for case in PAGED]


@pytest.mark.parametrize("label, action, exc, shows, layout", CASES, ids=[f"{c[0]}-{c[-1]}" for c in CASES])
def test_cache_bad_input(label, action, exc, shows, layout, backend, device):
    c = _cache(layout, device)
    tensors, host = (*c.layout.tensors(), c.lens), (list(c.host_lens()), c._block)
    with specops.use_backend(backend):
        raises(exc, shows, lambda: action(c), *tensors)  # and every byte of the storage and lens kept
    assert all(a is b for a, b in zip((*c.layout.tensors(), c.lens), tensors))
    assert (list(c.host_lens()), c._block) == host


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("lens_view", ["strided", "stride0"])
def test_cache_takes_strided_and_stride0_lengths(lens_view, layout, backend, device):
    # Per-sequence lengths given as views act like the contiguous tensors of the same values.
    def view(a, b):
        if lens_view == "strided":
            return torch.tensor([a, 9, b, 9], dtype=I32, device=device)[::2]
        return torch.tensor([a], dtype=I32, device=device).expand(2)

    got, want = _cache(layout, device), _cache(layout, device)
    with specops.use_backend(backend):
        for c, f in ((got, view), (want, lambda a, b: view(a, b).contiguous())):
            c.commit(f(2, 3))
            c.truncate(f(5, 4))
            c.compact(torch.tensor([[0, 1, 2]] * 2, dtype=I32, device=device), f(2, 1))
    for x, y in zip((*got.layout.tensors(), got.lens), (*want.layout.tensors(), want.lens)):
        assert torch.equal(x, y)
    assert got.host_lens() == want.host_lens() == want.lens.tolist()


# ---- generate ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models():
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    calls = []
    for name, m in (("target", target), ("draft", draft)):
        m.register_forward_pre_hook(lambda *a, n=name: calls.append(n))
    return target, draft, calls


def bad(name, *values, **fixed):
    """A case per value: generate(name=value, **fixed) raises ValueError showing the name and value's repr."""
    prefix = f"{fixed['method']}-" if "method" in fixed else ""
    return [(f"{prefix}{name}={v!r}", {**fixed, name: v}, V, (name, repr(v))) for v in values]


G = [  # (label, generate keyword arguments, exception, message parts)
    *bad("temperature", INF, NAN, -0.25, True, "0.5"), *bad("top_k", -1, 2.5, True), *bad("top_p", 0.0, 1.5, NAN, True),
    *bad("max_new_tokens", 0, -1, 2.5, "4"), *bad("max_len", -1, 0, 64.0, "64"),
    *bad("seed", "x", 1.5, None, 2**64, True), *bad("eos_token_id", "x", -1, 1.5), *bad("stop", 5, [1]),
    *bad("dtype", "fp8", 5), *bad("compare_ar", "yes", 1), *bad("record_steps", "no"), *bad("method", "nope", None),
    *bad("gamma", 0, 2.5, True), *bad("exit_threshold", NAN, 1.5),
    *bad("draft_temperature", NAN, INF, 0, "1", method="specinfer"), *bad("num_drafts", 0, method="specinfer"),
    *bad("ngram", "yes", method="specinfer"), *bad("theta_prob", NAN, method="tsd"), *bad("max_nodes", 1, method="tsd"),
    *bad("tau", -1, method="tsd"), *bad("verify", "mss", method="tsd"), *bad("verify", "greedy", method="gsd"),
    *bad("delta", NAN, INF, -1, True, method="opt-tree"), *bad("max_depth", 0, method="opt-tree"),
    *bad("verify", "mss", method="opt-tree"), *bad("window", -1, method="ouroboros"),
    *bad("ngram", 1, method="ouroboros"), *bad("model_free", 1, method="ouroboros"),
    *bad("reuse_pool", "no", method="ouroboros"), *bad("tau", NAN, 1.5, method="mjsd"), *bad("beams", 0, method="mjsd"),
    *bad("joint_top_k", -1, method="mjsd"), *bad("joint_top_p", 0, NAN, method="mjsd"),
    *bad("max_gamma", 1, method="ngram"), *bad("branches", 0, method="ngram"),
    ("max_new_tokens-huge", dict(max_new_tokens=5000), V, ("max_new_tokens (5000)", "max_position_embeddings=1024")),
    ("max_len-too-small", dict(max_len=8), V, ("too long", "max_len=8")),
    ("eos-list-str", dict(eos_token_id=[1, "2"]), V, ("eos_token_id", "'2'")),
    ("eos-bool", dict(eos_token_id=[True]), V, ("eos_token_id", "True")),
    ("stop-list-none", dict(stop=["ok", None]), V, ("stop", "None")),
    ("stop-needs-tokenizer", dict(stop="ok"), V, ("stop strings", "tokenizer")),
    ("tokenizer-int", dict(tokenizer=5), V, ("tokenizer", "int")),
    ("stream-int", dict(stream=5), E, ("stream", "int")),
    ("param-unknown", dict(gama=3), V, ("parameter", "gama")),
    ("tsd-k-zero", dict(method="tsd", k=0), V, ("k must", "0")),
    ("opt-tree-n-zero", dict(method="opt-tree", n=0), V, ("n must", "0")),
    ("opt-tree-n-huge", dict(method="opt-tree", n=2**31), V, ("n must", str(2**31), "65535")),
    ("mjsd-beams-huge", dict(method="mjsd", beams=10**6), V, ("beams", "1000000", "65536")),
    ("ngram-min-above-max", dict(method="ngram", min_ngram=4), V, ("min_ngram (4)", "max_ngram (3)")),
    ("prompt-empty-list", dict(prompt=[]), V, ("prompt", "list")),
    ("prompt-empty-row", dict(prompt=[[1, 2], []]), V, ("prompt 1", "empty")),
    ("prompt-past-vocab", dict(prompt=[[1, 500]]), V, ("prompt[0][1] = 500", "[0, 128)")),
    ("prompt-negative-id", dict(prompt=[[3], [1, -1]]), V, ("prompt[1][1] = -1",)),
    ("prompt-string-no-tokenizer", dict(prompt="hi"), V, ("string prompts", "tokenizer")),
    ("prompt-int", dict(prompt=5), V, ("prompt", "int 5")),
    ("prompt-float-tensor", dict(prompt=torch.zeros(3)), V, ("prompt tensor", "torch.float32")),
    ("prompt-mixed-list", dict(prompt=[[1], "a"]), V, ("prompt", "str")),
    ("draft-other-vocab", dict(draft=lambda: tiny_causal_lm("llama", vocab_size=96, seed=3)), V,
     ("vocabulary", "96", "128")),
    ("draft-int", dict(draft=5), E, ("draft", "int")),
    ("draft-missing", dict(method="tsd", draft=None), V, ("draft", "tsd")),
    ("target-int", dict(target=5), E, ("target", "int")),
    # issue #34: sizes checked against what they mean, before any allocation or forward
    ("paged-page-size-huge", dict(kv_layout="paged", page_size=2**28), V, ("page_size", str(2**28))),
    ("paged-page-size-past-max-len", dict(kv_layout="paged", max_len=40, page_size=128), V,
     ("page_size must be <= 64", "128")),
    ("sd-gamma-huge", dict(gamma=10**6), V, ("gamma=1000000", "block", "max_position_embeddings=1024")),
    ("sd-gamma-past-max-len", dict(gamma=40, max_len=30), V, ("gamma=40", "block", "max_len=30")),
    ("prompt-empty-batch-tensor", dict(prompt=torch.zeros(0, 3, dtype=I64)), V, ("prompt", "(0, 3)")),
    ("prompt-bool-token", dict(prompt=[[1, True, 3]]), V, ("prompt[0][1] = True", "bool")),
    ("eos-past-vocab", dict(eos_token_id=500), V, ("eos_token_id", "500", "[0, 128)")),
    ("eos-list-past-vocab", dict(eos_token_id=[2, 128]), V, ("eos_token_id", "128", "[0, 128)")),
    ("draft-meta", dict(draft=lambda: tiny_causal_lm("llama", seed=3).to("meta")), V, ("draft", "meta")),
    ("draft-float64", dict(draft=lambda: tiny_causal_lm("llama", seed=3).double()), V, ("draft", "torch.float64")),
    ("kv_layout-unknown", dict(kv_layout="pages"), V, ("kv_layout", "'pages'")),
    ("page_size-not-power-of-two", dict(kv_layout="paged", page_size=12), V, ("page_size", "power of two", "12")),
]
# Each case on both layouts (kv_layout=); a case that names its layout runs on that one.
G_CASES = [(*g, lay) for g in G for lay in ((g[1]["kv_layout"],) if "kv_layout" in g[1] else LAYOUTS)]


@pytest.mark.parametrize("label, kwargs, exc, shows, layout", G_CASES, ids=[f"{g[0]}-{g[-1]}" for g in G_CASES])
def test_generate_bad_input_raises_before_any_forward(label, kwargs, exc, shows, layout, models, backend):
    target, draft, calls = models
    kw = dict(target=target, prompt=[[1, 2, 3], [4, 5]], draft=draft, method="sd", max_new_tokens=4, kv_layout=layout)
    if layout == "paged":  # pages small enough for every max_len of the cases
        kw["page_size"] = 4
    kw.update({k: (v() if callable(v) else v) for k, v in kwargs.items()})
    calls.clear()
    with specops.use_backend(backend):
        raises(exc, shows, lambda: specops.generate(kw.pop("target"), kw.pop("prompt"), **kw))
    assert calls == [], f"{len(calls)} forwards ran before the error"


@pytest.mark.parametrize("method, temperature, kw", [("sd", 1e-40, {}), ("specinfer", 1e-40, {}),
                                                     ("specinfer", 0.0, {"draft_temperature": 1e-40})])
def test_a_vanishing_temperature_decodes_greedily(method, temperature, kw, models, backend, one_thread):
    # Regression (issue #16 item 3): logits / 1e-40 overflowed to inf - inf = NaN and
    # torch.multinomial raised after the prefill; t -> 0 must degrade to greedy decoding.
    target, draft, _ = models
    run = dict(draft=draft, method=method, max_new_tokens=4, eos_token_id=[], gamma=2)
    with specops.use_backend(backend):
        got, _ = specops.generate(target, [[1, 2, 3], [7, 8]], temperature=temperature, **run, **kw)
        want, _ = specops.generate(target, [[1, 2, 3], [7, 8]], temperature=0.0, **run)
    assert torch.equal(got, want)


@pytest.mark.parametrize("label", ["sd-gamma-huge", "sd-gamma-past-max-len"])
def test_a_block_too_large_is_not_called_a_long_prompt(label, models):
    target, draft, _ = models
    kw = dict(next(g[1] for g in G if g[0] == label))
    with pytest.raises(ValueError) as info:
        specops.generate(target, [[1, 2, 3]], draft=draft, method="sd", max_new_tokens=4, **kw)
    assert "prompt too long" not in str(info.value)


def test_the_battery_is_large():
    assert len(CACHE) + len(G) >= 150 and len({c[0] for c in CACHE}) == len(CACHE) and len({g[0] for g in G}) == len(G)


def test_the_forward_counter_sees_forwards(models):
    # What makes "no forward ran" above meaningful: a valid call is counted.
    target, draft, calls = models
    calls.clear()
    specops.generate(target, [[1, 2, 3]], draft=draft, method="sd", max_new_tokens=2, eos_token_id=[])
    assert "target" in calls and "draft" in calls
