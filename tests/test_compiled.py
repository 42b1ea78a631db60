"""Compiled block forwards (``ModelRunner(compile=True)``, specops/engine/compiled.py) on tiny
fp32 models: every lossless method stays token-identical to greedy decoding (tests/test_decoding.py's
grid), compiled AR and block logits equal eager ones (ragged trees, both cache layouts, ``q_start``),
the graphs stay within the buckets, and compile time is reported apart.

Compiling takes tens of seconds per graph on a loaded 2-core machine: the tests share one target and
draft (llama_pair, a module fixture), so each bucket compiles once per model for the file (and the
inductor disk cache makes a second run mostly tracing)."""
import functools

import pytest
import torch

from specops.decoding import generate
from specops.engine import ModelRunner, compiled, pad_batch
from specops.testing import perturbed_copy, random_parents, tiny_causal_lm

from test_decoding import LOSSLESS, N_NEW, _run
from test_kv_compact import i32

pytestmark = pytest.mark.usefixtures("one_thread")
PAGED = {"kv_layout": "paged", "page_size": 4}
LAYOUTS = pytest.mark.parametrize("layout", [{}, PAGED], ids=["contiguous", "paged"])


def test_buckets():
    assert [compiled.bucket_for(t) for t in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 64, 64]
    assert compiled.bucket_for(65) is None
    assert [compiled.mask_words(t) for t in (1, 32, 33, 64, 65, 129)] == [1, 1, 2, 2, 4, 8]


def test_bad_arguments_are_rejected(llama_pair):
    target = llama_pair[0]
    with pytest.raises(ValueError, match="compile must be a bool"):
        ModelRunner(target, 1, 32, compile="yes")
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        ModelRunner(target, 1, 32, compile=True, compile_mode="fast")


@LAYOUTS
def test_compiled_block_logits_equal_eager_ones(llama_pair, layout):
    block_logits_match(llama_pair[0], layout)


@LAYOUTS
def test_a_graph_of_a_run_of_layers_serves_every_run(layout):
    # 10 layers: one graph of 5 called twice, each call with its own layers' weights and stores.
    target = tiny_causal_lm("llama", seed=3, num_layers=10)
    assert compiled.run_length(10) == 5 and compiled.run_length(7) == 7 and compiled.run_length(30) == 6
    block_logits_match(target, layout)
    assert compiled.decoder_for(target).layered and compiled.decoder_for(target).run_length == 5
    compiled.release(target)


def block_logits_match(target, layout):
    """Ragged tree blocks of 5 and 9 nodes, a partial block (q_start) and a compaction in between:
    the compiled runner's logits and cache follow the eager runner's."""
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 128, (3, 13), generator=gen)
    lens, num = i32([13, 6, 9]), i32([9, 5, 7])
    parents = random_parents(3, 9, num_nodes=num, generator=gen)
    tokens = torch.randint(0, 128, (3, 9), generator=gen)
    accept = i32([[0, 2, 5], [0, 1, 0], [0, 3, 4]]), i32([3, 2, 1])
    outs = []
    for compile_ in (False, True):
        with torch.inference_mode():  # generate's mode: the graphs are shared with the tests below
            r = ModelRunner(target, 3, 48, compile=compile_, **layout)
            first = r.prefill_padded(prompt, lens, last_only=True)
            whole = r.forward(tokens, parents, num)
            r.keep(*accept)
            head = r.forward(tokens[:, :4], parents[:, :4].clamp(max=2), torch.full_like(num, 4))
            tail = r.forward(tokens[:, 4:6], parents[:, :6].clamp(max=3), torch.full_like(num, 6), q_start=4)
        outs.append((first, whole, head, tail, r.lens.clone()))
    for name, eager, comp in zip(("prefill", "tree", "head", "q_start", "lens"), *outs):
        if name == "tree":  # padding rows of the ragged batch are unspecified
            for b, n in enumerate(num.tolist()):
                torch.testing.assert_close(comp[b, :n], eager[b, :n], atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(comp, eager, atol=1e-5, rtol=1e-5, msg=name)


@LAYOUTS
def test_prompts_prefill_through_the_graph_in_chunks_of_64_rows(llama_pair, layout):
    # A prompt of any length prefills through the compiled block, 64 rows at a time (the HF model's
    # eager forward is never called); a prompt that ended sits the later chunks out. The logits (last
    # rows, every row), the features and the next block's logits equal eager's.
    target = llama_pair[0]
    prompts = [[3, 5, 7], [4, 9] * 75]  # 3 and 150 tokens: chunks of 64, 64 and 22 rows
    ids, lens = pad_batch(prompts)
    calls = []
    hook = target.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with torch.inference_mode():
            runs = {}
            for name, kw in (("compiled", {"compile": True}), ("eager", {})):
                if name == "eager":
                    assert calls == []  # nothing above ran the HF forward
                r = ModelRunner(target, 2, 200, keep_features=True, **layout, **kw)
                last = r.prefill(prompts)
                assert r.host_lens == [3, 150]
                feats = r.features[:, :150].clone()
                nxt = r.forward(torch.tensor([[11], [12]]), torch.full((2, 1), -1, dtype=torch.int32))
                rows = r.prefill_padded(ids, lens)  # [B, L, V]
                runs[name] = (last, feats, nxt, rows)
                r.close()
    finally:
        hook.remove()
    (last, feats, nxt, rows), (e_last, e_feats, e_nxt, e_rows) = runs["compiled"], runs["eager"]
    assert last.shape == (2, target.config.vocab_size) and rows.shape == (2, 150, target.config.vocab_size)
    torch.testing.assert_close(last, e_last, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, e_nxt, atol=1e-5, rtol=1e-5)
    for b, n in enumerate(lens.tolist()):  # rows past a prompt's length are padding
        torch.testing.assert_close(feats[b, :n], e_feats[b, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rows[b, :n], e_rows[b, :n], atol=1e-5, rtol=1e-5)


def test_compiled_ar_matches_eager_ar_and_reports_compile_time(llama_pair):
    target, _, prompts, refs = llama_pair
    eager, _ = generate(target, prompts, method="ar", max_new_tokens=N_NEW, eos_token_id=[])
    out, _ = generate(target, prompts, method="ar", max_new_tokens=N_NEW, eos_token_id=[], compile=True)
    assert out.tolist() == eager.tolist() == [r[:N_NEW] for r in refs]
    # A second runner of the same model and shapes compiles nothing: the graph is shared.
    with torch.inference_mode():  # as generate builds its runners (inference tensors)
        r = ModelRunner(target, 3, 40, compile=True)
        assert r.warmup([1]) == 0.0
    assert r.compile_time_s == 0.0
    dec = compiled.decoder_for(target)
    assert any(k[0] == compiled.BLOCK and s > 0 for k, s in dec.compile_s.items())


def test_frozen_decoder_runs_warm_graphs_and_refuses_new_ones(llama_pair):
    # Timed work after a warm-up runs under frozen(): the warmed graph runs, a new one raises before
    # anything compiles (here: another batch size, another graph key).
    target, _, prompts, refs = llama_pair
    kw = {"method": "ar", "max_new_tokens": 4, "eos_token_id": [], "compile": True}
    generate(target, prompts, **kw)
    dec = compiled.decoder_for(target)
    seen = dict(dec.compile_s)
    with dec.frozen():
        out, _ = generate(target, prompts, **kw)
        with pytest.raises(RuntimeError, match="needs a new compiled graph.*batch 1"):
            generate(target, prompts[:1], **kw)
    assert out.tolist() == [r[:4] for r in refs]
    assert dec.compile_s == seen


# Fixed budgets on the contiguous cache for every lossless case; the adaptive controller and the
# paged layout on a few (each extra combination only re-runs graphs already compiled).
GRID = [pytest.param(case, False, {}, id=case) for case in LOSSLESS if case != "ar"]
GRID += [pytest.param(case, True, {}, id=f"{case}-adaptive") for case in ("sd", "tsd", "ngram")]
GRID += [pytest.param(case, False, PAGED, id=f"{case}-paged") for case in ("opt-tree", "ouroboros")]


@pytest.mark.parametrize("case, adaptive, layout", GRID)
def test_compiled_greedy_is_token_identical_to_greedy_decoding(llama_pair, case, adaptive, layout):
    target, draft, prompts, refs = llama_pair
    out, m = _run(target, draft, prompts, case, adaptive=adaptive, compile=True, **layout)
    assert out.tolist() == [r[:N_NEW] for r in refs]
    assert m.num_target_forwards <= N_NEW
    # one graph for every row count: AR's one-row steps, chain drafts and blocks
    for model in (target, draft):
        for key in compiled.decoder_for(model).compile_s:
            assert key[0] == compiled.BLOCK


def test_feature_draft_compiled_is_lossless():
    # An EAGLE-style draft: its own input layer (features) before the decoder, and the target's
    # feature capture (a forward hook on the final norm) applied to the compiled graph's output.
    from test_distill import fresh_draft, tiny_target

    target = tiny_target(seed=3)
    d = fresh_draft(target, arch="feature", seed=4).eval()
    prompts = [[5, 9, 33, 4, 71, 12], [8, 100, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    kw = {"draft": d, "method": "sd", "max_new_tokens": 12, "eos_token_id": [], "adaptive": False}
    ref, _ = generate(target, prompts, method="ar", max_new_tokens=12, eos_token_id=[])
    _, m_eager = generate(target, prompts, **kw)
    out, m = generate(target, prompts, compile=True, **kw)
    assert torch.equal(out, ref)
    # the same drafts as the eager runners: the draft read the same features, the target captured them
    assert (m.num_accepted_tokens, m.num_draft_tokens) == (m_eager.num_accepted_tokens, m_eager.num_draft_tokens)
    assert m.num_accepted_tokens > 0


def test_a_new_decoder_loads_the_saved_graph_instead_of_compiling(tmp_path, monkeypatch, capfd):
    # A graph is compiled ahead of time and saved under the specops cache; a decoder with nothing in
    # memory (as in a new process) loads it from there and decodes the same tokens.
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path))
    model = tiny_causal_lm("llama", seed=7)
    model.specops_name = f"{tmp_path}/models/my-llama/"  # a model loaded from a path is named by it
    prompts = [[5, 9, 33, 4], [8, 100, 3, 4, 5, 6]]
    kw = {"method": "ar", "max_new_tokens": 6, "eos_token_id": []}
    ref, _ = generate(model, prompts, **kw)
    first, _ = generate(model, prompts, compile=True, **kw)
    saved = sorted((tmp_path / "compiled").glob("*.aot"))
    assert len(saved) == 1, saved  # the one graph, which AR's one-row steps run
    assert saved[0].name.startswith("my-llama-") and not (tmp_path / "models").exists()
    assert "compiled and saved to" in capfd.readouterr().err
    compiled.release(model)
    again, _ = generate(model, prompts, compile=True, **kw)
    assert f"loaded from {saved[0]}" in capfd.readouterr().err
    assert sorted((tmp_path / "compiled").glob("*.aot")) == saved
    assert torch.equal(first, ref) and torch.equal(again, ref)
    # a corrupt file is compiled again (and replaced), not trusted
    saved[0].write_bytes(b"not a graph")
    compiled.release(model)
    third, _ = generate(model, prompts, compile=True, **kw)
    err = capfd.readouterr().err
    assert "could not load" in err and "compiled and saved to" in err
    assert torch.equal(third, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_cuda_graphs_ar_and_sd_match_eager():
    # mode="reduce-overhead": CUDA graphs over the cache buffers (marked dynamic, updated in place).
    target = tiny_causal_lm("llama", seed=0).cuda()
    draft = perturbed_copy(target, 0.15, seed=1).cuda()
    prompts = [[3, 5, 7, 9, 11], [4, 6, 8]]
    ref, _ = generate(target, prompts, method="ar", max_new_tokens=16, eos_token_id=[])
    for method in ("ar", "sd"):
        out, _ = generate(target, prompts, draft=draft, method=method, max_new_tokens=16, eos_token_id=[],
                          adaptive=False, compile=True, compile_mode="reduce-overhead")
        assert torch.equal(out.cpu(), ref.cpu()), method


def test_a_saved_graphs_signature_names_a_kernel_bound_to_its_layout():
    # The torch backend's attention is a partial bound to its layout (no extension built): the
    # signature names the function and its bound arguments, the same in every process.
    from specops.ops.tree_attention import ref

    bound = functools.partial(ref.tree_attention, True)
    sig = compiled._signature((bound,))
    assert sig == compiled._signature((functools.partial(ref.tree_attention, True),))
    assert sig != compiled._signature((functools.partial(ref.tree_attention, False),))
    assert "tree_attention" in repr(sig) and "0x" not in repr(sig)
