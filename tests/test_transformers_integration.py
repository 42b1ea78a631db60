"""The "specops" attention implementation and the engine's ModelRunner on tiny random HF models: one tree forward
equals running each root-to-leaf path as a plain sequence; compaction after every step keeps the
logits of a plain recompute of the accepted sequence. Feature capture for EAGLE-style drafters:
``ModelRunner(keep_features=True).features[b, p]`` is the LM head's input at committed position ``p``
after prefill and every ``keep`` (chain prefixes and tree paths, ragged batches); without
``keep_features`` no hook exists; ``generate`` turns it on from ``needs_target_features``."""
from functools import partial

import pytest
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

import specops
from specops.cache import PagedKVCache, StaticKVCache
from specops.decoding import generate, loop, methods
from specops.decoding.draft_lm import DraftLM
from specops.decoding.sampling import SamplingConfig
from specops.decoding.stopping import Stopper
from specops.distill import data
from specops.engine import ModelRunner
from specops.integrations.transformers import SpecModel, use_specops_attention
from specops.testing import random_parents

from test_kv_compact import i32

pytestmark = pytest.mark.usefixtures("one_thread")

GQA = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "max_position_embeddings": 256}
ARCHS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=97, **GQA)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(vocab_size=97, **GQA)),
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=97, **{**GQA, "num_key_value_heads": 1},
                                                         head_dim=32, sliding_window=512)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                               bos_token_id=0, eos_token_id=0)),
}


def tiny_model(arch, *, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return ARCHS[arch]().to(dtype).eval()


def plain_logits(model, ids):
    """Logits of an ordinary forward with the stock sdpa attention. Shape: ids [1, L] -> [L, V]."""
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits[0].float()
    finally:
        model.set_attn_implementation(before)


def head_inputs(model, ids):
    """The LM head's input over plain_logits' forward. Shape: ids list of L ints -> fp32 [L, H]."""
    with data.head_inputs(model) as got:
        plain_logits(model, torch.tensor([ids]))
    return got[-1][0].float()


def random_paths(parents, g):
    """One random root-to-node path per tree of ``parents`` [B, T] (the root always), as the loop's
    keep() takes it: (paths, accept_idx [B, T] with garbage past each path, accept_lens [B])."""
    B, T = parents.shape
    vis = specops.unpack_mask(specops.build_tree_mask(parents)[0], T)
    paths = [vis[b, int(torch.randint(0, T, (1,), generator=g))].nonzero().flatten() for b in range(B)]
    accept_idx = torch.arange(T, dtype=torch.int32).repeat(B, 1) + T
    for b, path in enumerate(paths):
        accept_idx[b, :len(path)] = path.to(torch.int32)
    return paths, accept_idx, i32([len(p) for p in paths])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tree_forward_equals_each_path_as_a_sequence(arch):
    model = tiny_model(arch)
    prompt = torch.randint(0, 97, (1, 11))
    parents = i32([[-1, 0, 0, 1, 1, 2, 3, 6, 6]])
    tokens = torch.randint(0, 97, (1, 9))
    runner = ModelRunner(model, batch_size=1, max_len=64)
    with torch.no_grad():
        runner.prefill_padded(prompt, i32([11]))
        tree = runner.forward(tokens, parents)[0]
    vis = specops.unpack_mask(specops.build_tree_mask(parents)[0], 9)[0]
    for node in range(9):
        path = vis[node].nonzero().flatten()  # ancestors in topological order = the root-to-node path
        want = plain_logits(model, torch.cat([prompt, tokens[:, path]], dim=1))[-1]
        torch.testing.assert_close(tree[node], want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("page_size", [1, 4])
def test_compaction_after_every_step_matches_recompute_and_the_paged_layout(arch, page_size):
    # A contiguous and a paged runner side by side: the same logits (and argmax tokens) at every step.
    model = tiny_model(arch, seed=1)
    g = torch.Generator().manual_seed(3)
    B = 3
    lens = i32([5, 9, 7])
    prompts = torch.randint(0, 97, (B, 9), generator=g)
    runners = [ModelRunner(model, batch_size=B, max_len=80),
               ModelRunner(model, batch_size=B, max_len=80, kv_layout="paged", page_size=page_size)]
    assert runners[1].cache.page_table.shape == (B, 80 // page_size)
    seqs = [prompts[b, : lens[b]].tolist() for b in range(B)]
    with torch.no_grad():
        got = [r.prefill_padded(prompts, lens) for r in runners]
        torch.testing.assert_close(got[1], got[0], atol=1e-5, rtol=1e-5)
        for step in range(4):
            T = 6
            parents = random_parents(B, T, generator=g)
            tokens = torch.randint(0, 97, (B, T), generator=g)
            logits, paged = (r.forward(tokens, parents) for r in runners)
            torch.testing.assert_close(paged, logits, atol=1e-5, rtol=1e-5)
            assert torch.equal(paged.argmax(-1), logits.argmax(-1))
            paths, accept_idx, accept_lens = random_paths(parents, g)  # ragged lengths
            for b, path in enumerate(paths):
                want = plain_logits(model, torch.tensor([seqs[b] + tokens[b, path].tolist()]))[-len(path):]
                torch.testing.assert_close(logits[b, path], want, atol=3e-5, rtol=1e-4)
                seqs[b] += tokens[b, path].tolist()
            for r in runners:
                r.keep(accept_idx, accept_lens)
                assert r.lens.tolist() == [len(s) for s in seqs]


@pytest.mark.parametrize("make", [StaticKVCache.for_model, partial(PagedKVCache.for_model, page_size=4)],
                         ids=["contiguous", "paged"])
def test_plain_hf_forward_with_specops_attention_matches_sdpa(make):
    model = tiny_model("llama", seed=2)
    ids = torch.randint(0, 97, (2, 13))
    want = torch.stack([plain_logits(model, ids[b:b + 1]) for b in range(2)])
    use_specops_attention(model)
    with torch.no_grad():
        got = model(input_ids=ids).logits.float()  # no cache: a causal block from prefix 0
        cache = make(model, batch_size=2, max_len=32)
        model(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
        step = model(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True).logits.float()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(step, want[:, 8:], atol=2e-5, rtol=1e-4)
    assert cache.lens.tolist() == [13, 13]


def test_generate_with_specops_attention_equals_sdpa_greedy():
    model = tiny_model("qwen2", seed=4)
    ids = torch.randint(0, 97, (1, 6))
    want = model.generate(ids, max_new_tokens=8, do_sample=False)
    use_specops_attention(model)
    got = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)


def test_runner_rejects_bad_prompts_before_any_work():
    runner = ModelRunner(tiny_model("llama"), batch_size=2, max_len=16)
    ids = torch.randint(0, 97, (2, 5))
    with pytest.raises(ValueError, match=r"lens must lie in \[1, 5\]"):
        runner.prefill_padded(ids, i32([5, 0]))
    with pytest.raises(ValueError, match="exceeds the cache"):
        runner.prefill_padded(torch.randint(0, 97, (2, 17)), i32([17, 17]))
    with pytest.raises(ValueError, match=r"input_ids must have shape \[2, \*\]"):
        runner.prefill_padded(torch.randint(0, 97, (3, 5)), i32([5, 5]))
    assert runner.lens.tolist() == [0, 0]
    with torch.no_grad():
        runner.prefill_padded(ids, i32([5, 3]))
    with pytest.raises(ValueError, match="cache overflow"):
        runner.forward(torch.zeros(2, 12, dtype=torch.long), torch.arange(-1, 11, dtype=torch.int32).expand(2, 12))
    assert runner.lens.tolist() == [5, 3]


def test_prefill_last_only_equals_the_last_rows_of_a_full_prefill():
    model = tiny_model("llama", seed=5)
    ids = torch.randint(0, 97, (3, 9))
    lens = i32([9, 4, 6])
    with torch.no_grad():
        full = ModelRunner(model, batch_size=3, max_len=32)
        want = full.prefill_padded(ids, lens)[torch.arange(3), lens.long() - 1]
        last = ModelRunner(model, batch_size=3, max_len=32)
        got = last.prefill_padded(ids, lens, last_only=True)
        assert got.shape == (3, 97) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert last.lens.tolist() == [9, 4, 6]
        # the caches agree too: one more step gives the same logits
        step = torch.randint(0, 97, (3, 1))
        parents = torch.full((3, 1), -1, dtype=torch.int32)
        torch.testing.assert_close(last.forward(step, parents), full.forward(step, parents))


def test_one_plan_per_block_serves_every_layer(monkeypatch):
    # The hook builds a TreeAttentionPlan at the first layer and runs it on the others.
    from specops.engine import attention as hook

    built = []
    real = hook.TreeAttentionPlan

    def counting(*args, **kw):
        built.append(kw.get("page_table") is not None)
        return real(*args, **kw)

    monkeypatch.setattr(hook, "TreeAttentionPlan", counting)
    model = tiny_model("qwen2", seed=3)
    for layout in ("contiguous", "paged"):
        built.clear()
        runner = ModelRunner(model, batch_size=2, max_len=32, kv_layout=layout, page_size=8)
        with torch.no_grad():
            runner.prefill_padded(torch.randint(0, 97, (2, 6)), i32([6, 4]))
            runner.forward(torch.randint(0, 97, (2, 3)), i32([[-1, 0, 0]] * 2))
        assert built == [layout == "paged"] * 2  # two forwards, one plan each (the model has 2 layers)
    assert not hasattr(hook.Block, "kernel")


@pytest.mark.parametrize("kw, exc, match", [
    ({"kv_layout": "blocked"}, ValueError, r"kv_layout must be one of \('contiguous', 'paged'\), got 'blocked'"),
    ({"kv_layout": "paged", "page_size": 12}, ValueError, "page_size must be a power of two >= 1, got 12"),
    ({"kv_layout": "paged", "page_size": 0}, ValueError, "page_size must be >= 1, got 0"),
    ({"kv_layout": "paged", "page_size": "16"}, TypeError, "page_size must be an int"),
])
def test_spec_model_rejects_bad_layouts(kw, exc, match):
    with pytest.raises(exc, match=match):
        SpecModel(tiny_model("llama"), batch_size=1, max_len=16, **kw)  # the README's name, an alias


@pytest.mark.parametrize("method", ["sd", "specinfer", "opt-tree", "ngram"])
def test_generate_gives_the_target_and_the_draft_paged_runners(llama_pair, method, monkeypatch):
    # That the paged loop's tokens are plain greedy decoding's (and so the contiguous cache's) is
    # tests/test_decoding.py's batch-3 grid (paged-fixed, same models and prompts).
    target, draft, prompts, _ = llama_pair
    made = []
    init = ModelRunner.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", recording)
    generate(target, prompts, draft=None if method == "ngram" else draft, method=method, max_new_tokens=12,
             eos_token_id=[], adaptive=False, kv_layout="paged", page_size=4)
    monkeypatch.undo()
    assert len(made) == (1 if method == "ngram" else 2)
    assert all(r.kv_layout == "paged" and r.cache.page_size == 4 for r in made)


@pytest.mark.skipif(tuple(int(x) for x in __import__("transformers").__version__.split(".")[:2]) < (5, 20),
                    reason="transformers < 5.20 cannot keep one logits row per sequence (logits_to_keep per row)")
def test_logits_stay_in_the_model_dtype_and_the_head_sees_only_needed_rows():
    # A bf16 model's logits come back in bf16 (the loop upcasts what its ops need); prefill with
    # last_only sends one row per prompt through the LM head.
    model = tiny_model("llama", dtype=torch.bfloat16)
    rows = []
    hook = model.lm_head.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[1]))
    try:
        runner = ModelRunner(model, batch_size=2, max_len=32)
        with torch.no_grad():
            last = runner.prefill_padded(torch.randint(0, 97, (2, 7)), i32([7, 4]), last_only=True)
            block = runner.forward(torch.randint(0, 97, (2, 3)), i32([[-1, 0, 0]] * 2))
    finally:
        hook.remove()
    assert last.dtype == block.dtype == torch.bfloat16
    assert last.shape == (2, 97) and block.shape == (2, 3, 97)
    assert rows == [1, 3]


def test_want_hidden_returns_the_lm_head_input_of_the_block_rows():
    # EAGLE-style features are data: forward(..., want_hidden=True) -> (logits, hidden), hidden being
    # what the LM head read (so head(hidden) gives the logits back), for partial blocks too.
    model = tiny_model("llama", seed=7)
    runner = ModelRunner(model, batch_size=2, max_len=32)
    parents = i32([[-1, 0, 0, 1]] * 2)
    tokens = torch.randint(0, 97, (2, 4))
    with torch.no_grad():
        runner.prefill_padded(torch.randint(0, 97, (2, 6)), i32([6, 4]))
        plain = runner.forward(tokens[:, :2], parents[:, :2])
        logits, hidden = runner.forward(tokens[:, 2:], parents, q_start=2, want_hidden=True)
        torch.testing.assert_close(model.lm_head(hidden), logits, atol=1e-6, rtol=1e-6)
    assert isinstance(plain, torch.Tensor) and plain.shape == (2, 2, 97)
    assert hidden.shape == (2, 2, 64) and logits.shape == (2, 2, 97)


# ---- target features for EAGLE-style drafters ------------------------------------------------------

@pytest.mark.parametrize("method,params", [("sd", {"gamma": 3}), ("tsd", {}), ("ar", {})])
def test_features_at_committed_positions_equal_plain_forward_hidden_states(llama_pair, method, params,
                                                                           monkeypatch):
    target, draft, *_ = llama_pair
    paths = []  # the target's kept paths
    keep = loop.TargetLM.keep

    def record(self, idx, lens, host_counts, **kw):
        if self.keep_features:  # the target (the draft is a runner too)
            paths.extend(row[:n] for row, n in zip(idx.tolist(), host_counts))
        keep(self, idx, lens, host_counts, **kw)
    monkeypatch.setattr(loop.TargetLM, "keep", record)
    prompts = [[5, 17, 99, 3, 42, 8, 61], [70, 2, 33]]  # ragged
    drafter = methods.make(method, **params)
    max_len = max(len(p) for p in prompts) + 14 + drafter.tree_budget() + 1
    tlm = loop.TargetLM(target, 2, max_len, keep_features=True)
    dlm = DraftLM(draft, 2, max_len + drafter.draft_budget() + drafter.tree_budget() + 1) \
        if drafter.needs_draft_model else None
    try:
        with torch.inference_mode():
            gen, m = loop.decode(tlm, drafter, prompts, sampling=SamplingConfig(), stopper=Stopper(14),
                                 generator=torch.Generator().manual_seed(0), draft=dlm)
    finally:
        tlm.close()
    assert m.num_target_forwards >= 3
    if method == "tsd":  # it covers compaction only if some accepted path skipped block rows
        assert any(p and p != list(range(len(p))) for p in paths)
    lens = tlm.lens.tolist()
    assert tlm.features.dtype == next(target.parameters()).dtype
    for b, p in enumerate(prompts):
        # The last step may commit accepted tokens past the max_new_tokens cut: compare the
        # positions whose tokens were emitted (all but the pending one).
        n = len(p) + len(gen[b]) - 1
        assert n <= lens[b] and n >= len(p) + 10
        want = head_inputs(target, (p + gen[b])[:n])
        torch.testing.assert_close(tlm.features[b, :n].float(), want, atol=1e-5, rtol=1e-5)


def test_no_hook_and_no_buffer_without_keep_features(llama_pair):
    target = llama_pair[0]
    head, norm = target.get_output_embeddings(), target.get_decoder().norm

    def count():  # the capture hook sits on the final norm (whose output is the head's input)
        return len(head._forward_pre_hooks) + len(norm._forward_hooks)
    hooks = count()
    tlm = loop.TargetLM(target, 1, 32)
    assert tlm.features is None and count() == hooks
    with_feats = loop.TargetLM(target, 1, 32, keep_features=True)
    assert count() == hooks + 1
    with_feats.close()
    assert count() == hooks


def test_generate_turns_features_on_for_drafters_that_need_them(llama_pair, monkeypatch):
    target = llama_pair[0]
    seen = []

    class FeatureDrafter(methods.NullDrafter):
        needs_target_features = True

        def propose(self, state):
            seen.append((state.target.features is not None, state.target.lens.tolist()))
            return super().propose(state)

    monkeypatch.setattr(methods, "make", lambda name, **kw: FeatureDrafter(**kw))
    hooks = len(target.get_output_embeddings()._forward_pre_hooks)
    generate(target, [[1, 2, 3, 4]], method="ar", max_new_tokens=3, eos_token_id=[])
    assert seen == [(True, [4]), (True, [5])]
    assert len(target.get_output_embeddings()._forward_pre_hooks) == hooks  # removed afterwards
