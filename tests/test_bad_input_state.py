"""Bad input to StaticKVCache and generate, table-driven, on every backend (the battery of the
ops is tests/test_bad_input.py). A cache case asserts the exception type, that the message
names the argument and shows the value, and that k, v, lens and the cache's host-side state are
bit-identical afterwards. A generate case also asserts that no model forward ran."""
import pytest
import torch

import specops
from specops.cache import StaticKVCache
from specops.testing import tiny_causal_lm

I32, I64 = torch.int32, torch.int64
NAN, INF = float("nan"), float("inf")
V, E = ValueError, TypeError
L, B, H, S, D = 2, 2, 2, 16, 4


def _cache(device):
    g = torch.Generator().manual_seed(3)
    c = StaticKVCache(L, B, H, S, D, device=device)
    c.k.copy_(torch.randn(c.k.shape, generator=g))
    c.v.copy_(torch.randn(c.v.shape, generator=g))
    c.commit(torch.tensor([6, 3], dtype=I32, device=device))
    return c


def rows(T=1, dtype=torch.float32, b=B, h=H, d=D):
    return torch.randn(b, h, T, d, dtype=torch.float32).to(dtype)


def lens(*v, dtype=I32):
    return torch.tensor(v, dtype=dtype)


def _in_block(action, offset=0, n=2):
    def run(c):
        c.begin_block(offset, n)
        try:
            action(c)
        finally:
            c.end_block()
    return run


def _dev(x, c):  # CPU tensors of a case follow the cache to its device
    return x.to(c.k.device) if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x


def append(layer, k, v=None):
    return lambda c: c.append_block(layer, _dev(k, c), _dev(k if v is None else v, c))


def method(name, *args, **kw):
    return lambda c: getattr(c, name)(*(_dev(a, c) for a in args), **{k: _dev(x, c) for k, x in kw.items()})


def new(**kw):
    args = dict(num_layers=L, batch_size=B, num_kv_heads=H, max_len=S, head_dim=D)
    args.update(kw)
    return lambda c: StaticKVCache(**args)


CACHE = [
    ("dtype-int32", new(dtype=torch.int32), E, ("dtype", "torch.int32")),
    ("dtype-float64", new(dtype=torch.float64), E, ("dtype", "torch.float64")),
    ("dtype-str", new(dtype="fp32"), E, ("dtype", "'fp32'")),
    ("num_layers-0", new(num_layers=0), V, ("sizes", "[0, 2, 2, 16, 4]")),
    ("max_len-negative", new(max_len=-1), V, ("sizes", "[2, 2, 2, -1, 4]")),
    ("head_dim-float", new(head_dim=4.0), E, ("head_dim", "4.0")),
    ("batch_size-bool", new(batch_size=True), E, ("batch_size", "True")),
    ("num_kv_heads-str", new(num_kv_heads="2"), E, ("num_kv_heads", "'2'")),
    ("begin-offset-negative", method("begin_block", -5, 2), V, ("offset", "-5")),
    ("begin-rows-negative", method("begin_block", 0, -3), V, ("rows", "-3")),
    ("begin-rows-zero", method("begin_block", 0, 0), V, ("rows", "got 0")),
    ("begin-offset-str", method("begin_block", "1", 2), E, ("offset", "'1'")),
    ("begin-rows-float", method("begin_block", 0, 2.0), E, ("rows", "2.0")),
    ("begin-offset-bool", method("begin_block", True, 1), E, ("offset", "True")),
    ("begin-overflow", method("begin_block", 0, 11), V, ("max_len=16", "6 rows", "11 more")),
    ("begin-offset-overflow", method("begin_block", 8, 3), V, ("max_len=16", "11 more")),
    ("layer-negative", append(-1, rows()), V, ("layer", "-1")),
    ("layer-past-end", append(2, rows()), V, ("layer", "num_layers=2", "got 2")),
    ("layer-str", append("0", rows()), E, ("layer", "'0'")),
    ("layer-float", append(1.0, rows()), E, ("layer", "1.0")),
    ("layer-none", append(None, rows()), E, ("layer", "None")),
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
    ("k-view-of-cache", lambda c: c.append_block(0, c.k[1, :, :, :1], _dev(rows(), c)), V, ("k", "share memory")),
    ("v-view-of-cache", lambda c: c.append_block(0, _dev(rows(), c), c.v[0, :, :, 7:8]), V, ("v", "storage offset")),
    ("k-view-of-v-cache", lambda c: c.append_block(1, c.v[0, :, :, :2], c.v[0, :, :, 2:4]), V, ("k", "share memory")),
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
    ("crop-str", method("crop", "1"), E, ("tokens_to_remove", "'1'")),
    ("crop-float", method("crop", 1.5), E, ("tokens_to_remove", "1.5")),
    ("crop-bool", method("crop", True), E, ("tokens_to_remove", "True")),
    ("crop-none", method("crop", None), E, ("tokens_to_remove", "None")),
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
     ("accept_idx[0, 1] = 12", "S=16")),
    ("compact-lens-shape", method("compact", lens([0, 1], [0, 1]), lens(2)), V, ("accept_lens", "(1,)")),
]


def _raw(t):
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _state(c):
    return [_raw(c.k).clone(), _raw(c.v).clone(), _raw(c.lens).clone(), list(c.host_lens()), c._block]


@pytest.mark.parametrize("label, action, exc, shows", CACHE, ids=[c[0] for c in CACHE])
def test_cache_bad_input(label, action, exc, shows, backend, device):
    c = _cache(device)
    before = _state(c)
    with specops.use_backend(backend), pytest.raises(exc) as info:
        action(c)
    for part in shows:
        assert part in str(info.value), f"{part!r} missing from the message: {info.value}"
    after = _state(c)
    for name, x, y in zip(("k", "v", "lens"), before, after):
        assert torch.equal(x, y), f"{name} changed although the call raised"
    assert before[3:] == after[3:]


@pytest.mark.parametrize("layout", ["strided", "stride0"])
def test_cache_takes_strided_and_stride0_lengths(layout, backend, device):
    # Per-sequence lengths given as views act like the contiguous tensors of the same values.
    def view(a, b):
        if layout == "strided":
            return torch.tensor([a, 9, b, 9], dtype=I32, device=device)[::2]
        return torch.tensor([a], dtype=I32, device=device).expand(2)

    got, want = _cache(device), _cache(device)
    with specops.use_backend(backend):
        for c, f in ((got, view), (want, lambda a, b: view(a, b).contiguous())):
            c.commit(f(2, 3))
            c.truncate(f(5, 4))
            c.compact(torch.tensor([[0, 1, 2]] * 2, dtype=I32, device=device), f(2, 1))
    for x, y in ((got.k, want.k), (got.v, want.v), (got.lens, want.lens)):
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


G = [  # (label, generate keyword arguments, exception, message parts)
    ("temperature-inf", dict(temperature=INF), V, ("temperature", "inf")),
    ("temperature-nan", dict(temperature=NAN), V, ("temperature", "nan")),
    ("temperature-negative", dict(temperature=-0.25), V, ("temperature", "-0.25")),
    ("temperature-bool", dict(temperature=True), V, ("temperature", "True")),
    ("temperature-str", dict(temperature="0.5"), V, ("temperature", "'0.5'")),
    ("top_k-negative", dict(top_k=-1), V, ("top_k", "-1")),
    ("top_k-float", dict(top_k=2.5), V, ("top_k", "2.5")),
    ("top_k-bool", dict(top_k=True), V, ("top_k", "True")),
    ("top_p-zero", dict(top_p=0.0), V, ("top_p", "0.0")),
    ("top_p-above-one", dict(top_p=1.5), V, ("top_p", "1.5")),
    ("top_p-nan", dict(top_p=NAN), V, ("top_p", "nan")),
    ("top_p-bool", dict(top_p=True), V, ("top_p", "True")),
    ("max_new_tokens-zero", dict(max_new_tokens=0), V, ("max_new_tokens", "0")),
    ("max_new_tokens-negative", dict(max_new_tokens=-1), V, ("max_new_tokens", "-1")),
    ("max_new_tokens-float", dict(max_new_tokens=2.5), V, ("max_new_tokens", "2.5")),
    ("max_new_tokens-str", dict(max_new_tokens="4"), V, ("max_new_tokens", "'4'")),
    ("max_new_tokens-huge", dict(max_new_tokens=5000), V, ("max_new_tokens (5000)", "max_position_embeddings=1024")),
    ("max_len-negative", dict(max_len=-1), V, ("max_len", "-1")),
    ("max_len-zero", dict(max_len=0), V, ("max_len", "0")),
    ("max_len-float", dict(max_len=64.0), V, ("max_len", "64.0")),
    ("max_len-str", dict(max_len="64"), V, ("max_len", "'64'")),
    ("max_len-too-small", dict(max_len=8), V, ("too long", "max_len=8")),
    ("seed-str", dict(seed="x"), V, ("seed", "'x'")),
    ("seed-float", dict(seed=1.5), V, ("seed", "1.5")),
    ("seed-none", dict(seed=None), V, ("seed", "None")),
    ("seed-huge", dict(seed=2**64), V, ("seed", str(2**64))),
    ("seed-bool", dict(seed=True), V, ("seed", "True")),
    ("eos-str", dict(eos_token_id="x"), V, ("eos_token_id", "'x'")),
    ("eos-negative", dict(eos_token_id=-1), V, ("eos_token_id", "-1")),
    ("eos-list-str", dict(eos_token_id=[1, "2"]), V, ("eos_token_id", "'2'")),
    ("eos-float", dict(eos_token_id=1.5), V, ("eos_token_id", "1.5")),
    ("eos-bool", dict(eos_token_id=[True]), V, ("eos_token_id", "True")),
    ("stop-int", dict(stop=5), V, ("stop", "5")),
    ("stop-list-int", dict(stop=[1]), V, ("stop", "[1]")),
    ("stop-list-none", dict(stop=["ok", None]), V, ("stop", "None")),
    ("stop-needs-tokenizer", dict(stop="ok"), V, ("stop strings", "tokenizer")),
    ("tokenizer-int", dict(tokenizer=5), V, ("tokenizer", "int")),
    ("dtype-unknown", dict(dtype="fp8"), V, ("dtype", "'fp8'")),
    ("dtype-int", dict(dtype=5), V, ("dtype", "5")),
    ("compare_ar-str", dict(compare_ar="yes"), V, ("compare_ar", "'yes'")),
    ("compare_ar-int", dict(compare_ar=1), V, ("compare_ar", "1")),
    ("record_steps-str", dict(record_steps="no"), V, ("record_steps", "'no'")),
    ("stream-int", dict(stream=5), E, ("stream", "int")),
    ("method-unknown", dict(method="nope"), V, ("method", "'nope'")),
    ("method-none", dict(method=None), V, ("method", "None")),
    ("param-unknown", dict(gama=3), V, ("parameter", "gama")),
    ("sd-gamma-zero", dict(gamma=0), V, ("gamma", "0")),
    ("sd-gamma-float", dict(gamma=2.5), V, ("gamma", "2.5")),
    ("sd-gamma-bool", dict(gamma=True), V, ("gamma", "True")),
    ("sd-exit-nan", dict(exit_threshold=NAN), V, ("exit_threshold", "nan")),
    ("sd-exit-above-one", dict(exit_threshold=1.5), V, ("exit_threshold", "1.5")),
    ("specinfer-draft-t-nan", dict(method="specinfer", draft_temperature=NAN), V, ("draft_temperature", "nan")),
    ("specinfer-draft-t-inf", dict(method="specinfer", draft_temperature=INF), V, ("draft_temperature", "inf")),
    ("specinfer-draft-t-zero", dict(method="specinfer", draft_temperature=0), V, ("draft_temperature", "0")),
    ("specinfer-draft-t-str", dict(method="specinfer", draft_temperature="1"), V, ("draft_temperature", "'1'")),
    ("specinfer-num-drafts-zero", dict(method="specinfer", num_drafts=0), V, ("num_drafts", "0")),
    ("specinfer-ngram-str", dict(method="specinfer", ngram="yes"), V, ("ngram", "'yes'")),
    ("tsd-k-zero", dict(method="tsd", k=0), V, ("k must", "0")),
    ("tsd-theta-nan", dict(method="tsd", theta_prob=NAN), V, ("theta_prob", "nan")),
    ("tsd-max-nodes-one", dict(method="tsd", max_nodes=1), V, ("max_nodes", "1")),
    ("tsd-tau-negative", dict(method="tsd", tau=-1), V, ("tau", "-1")),
    ("tsd-verify-mss", dict(method="tsd", verify="mss"), V, ("verify", "'mss'")),
    ("gsd-verify-greedy", dict(method="gsd", verify="greedy"), V, ("verify", "'greedy'")),
    ("opt-tree-delta-nan", dict(method="opt-tree", delta=NAN), V, ("delta", "nan")),
    ("opt-tree-delta-inf", dict(method="opt-tree", delta=INF), V, ("delta", "inf")),
    ("opt-tree-delta-negative", dict(method="opt-tree", delta=-1), V, ("delta", "-1")),
    ("opt-tree-delta-bool", dict(method="opt-tree", delta=True), V, ("delta", "True")),
    ("opt-tree-n-zero", dict(method="opt-tree", n=0), V, ("n must", "0")),
    ("opt-tree-n-huge", dict(method="opt-tree", n=2**31), V, ("n must", str(2**31), "65535")),
    ("opt-tree-depth-zero", dict(method="opt-tree", max_depth=0), V, ("max_depth", "0")),
    ("opt-tree-verify-mss", dict(method="opt-tree", verify="mss"), V, ("verify", "'mss'")),
    ("ouroboros-window-negative", dict(method="ouroboros", window=-1), V, ("window", "-1")),
    ("ouroboros-ngram-one", dict(method="ouroboros", ngram=1), V, ("ngram", "1")),
    ("ouroboros-model-free-int", dict(method="ouroboros", model_free=1), V, ("model_free", "1")),
    ("ouroboros-reuse-pool-str", dict(method="ouroboros", reuse_pool="no"), V, ("reuse_pool", "'no'")),
    ("mjsd-tau-nan", dict(method="mjsd", tau=NAN), V, ("tau", "nan")),
    ("mjsd-tau-above-one", dict(method="mjsd", tau=1.5), V, ("tau", "1.5")),
    ("mjsd-beams-zero", dict(method="mjsd", beams=0), V, ("beams", "0")),
    ("mjsd-beams-huge", dict(method="mjsd", beams=10**6), V, ("beams", "1000000", "65536")),
    ("mjsd-joint-top-k-negative", dict(method="mjsd", joint_top_k=-1), V, ("joint_top_k", "-1")),
    ("mjsd-joint-top-p-zero", dict(method="mjsd", joint_top_p=0), V, ("joint_top_p", "0")),
    ("mjsd-joint-top-p-nan", dict(method="mjsd", joint_top_p=NAN), V, ("joint_top_p", "nan")),
    ("ngram-max-gamma-below-gamma", dict(method="ngram", max_gamma=1), V, ("max_gamma", "1")),
    ("ngram-min-above-max", dict(method="ngram", min_ngram=4), V, ("min_ngram (4)", "max_ngram (3)")),
    ("ngram-branches-zero", dict(method="ngram", branches=0), V, ("branches", "0")),
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
]


@pytest.mark.parametrize("label, kwargs, exc, shows", G, ids=[g[0] for g in G])
def test_generate_bad_input_raises_before_any_forward(label, kwargs, exc, shows, models, backend):
    target, draft, calls = models
    kw = dict(target=target, prompt=[[1, 2, 3], [4, 5]], draft=draft, method="sd", max_new_tokens=4)
    kw.update({k: (v() if callable(v) else v) for k, v in kwargs.items()})
    calls.clear()
    with specops.use_backend(backend), pytest.raises(exc) as info:
        specops.generate(kw.pop("target"), kw.pop("prompt"), **kw)
    for part in shows:
        assert part in str(info.value), f"{part!r} missing from the message: {info.value}"
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
