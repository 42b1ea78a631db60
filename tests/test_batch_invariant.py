"""generate(batch_invariant=True): every lossless method's greedy output equals AR's, token for token,
in bf16 (where the fast path's block reductions drift), contiguous and paged; a sequence decoded in a
batch of 3 equals the same sequence decoded alone; bad input; the model is restored afterwards
(docs/batch_invariance.md)."""
import pytest
import torch

from specops import backend as _backend
from specops import generate
from specops.engine import ModelRunner
from specops.testing import perturbed_copy, tiny_causal_lm
from test_decoding import LOSSLESS

pytestmark = pytest.mark.skipif(not _backend.available("cpp")[0], reason="the invariant mode runs the cpp kernels")

N_NEW = 24
PROMPT_LENS = (7, 13, 4)
# Each method's own blocks (fixed budgets) and the adaptive controller's, which mixes block sizes.
CASES = ["sd", "ngram", "ngram-branches", "specinfer", "tsd", "gsd-no-merge", "opt-tree-deep", "ouroboros"]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def bf16_pair(request):
    """(target, draft, prompts, AR's batch-invariant output) in bf16; a wider model than the loop
    tests' so that reductions are long enough to round differently."""
    target = tiny_causal_lm(request.param, hidden_size=96, num_layers=3, seed=2, dtype=torch.bfloat16)
    draft = perturbed_copy(target, 0.15, seed=3)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    return target, draft, prompts, _run(target, None, prompts, "ar")[0]


def _run(target, draft, prompts, case, **kw):
    params = {"method": case, "draft": draft, **LOSSLESS[case], **kw}
    return generate(target, prompts, max_new_tokens=N_NEW, eos_token_id=[], batch_invariant=True, **params)


@pytest.mark.parametrize("layout", [{}, {"kv_layout": "paged", "page_size": 4}], ids=["contiguous", "paged"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("case", CASES)
def test_lossless_methods_emit_ar_tokens_in_bf16(bf16_pair, case, adaptive, layout):
    target, draft, prompts, ar = bf16_pair
    out, m = _run(target, draft, prompts, case, adaptive=adaptive, **layout)
    assert out.tolist() == ar.tolist()
    assert m.num_target_forwards < N_NEW * 1.05  # the blocks really were verified as blocks


def test_a_sequence_in_a_batch_of_3_equals_it_alone(bf16_pair):
    target, draft, prompts, ar = bf16_pair
    for b, p in enumerate(prompts):
        for case in ("ar", "opt-tree-deep"):
            assert _run(target, draft, [p], case)[0][0].tolist() == ar[b].tolist(), case


def test_paged_ar_equals_contiguous_ar(bf16_pair):
    target, _, prompts, ar = bf16_pair
    assert _run(target, None, prompts, "ar", kv_layout="paged", page_size=4)[0].tolist() == ar.tolist()


def test_bad_input_and_the_model_is_restored():
    target = tiny_causal_lm("llama", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="batch_invariant must be True, False or 'auto', got 1"):
        generate(target, [[1, 2]], method="ar", max_new_tokens=2, batch_invariant=1)
    with pytest.raises(ValueError, match="linear must be 'auto' or 'specops'"):
        generate(target, [[1, 2]], method="ar", max_new_tokens=2, batch_invariant=True, linear="torch")
    with pytest.raises(ValueError, match="batch_invariant must be True, False or 'auto', got 'yes'"):
        ModelRunner(target, 1, 8, batch_invariant="yes")
    runner = ModelRunner(target, 1, 8, batch_invariant=True)
    assert all("forward" in vars(m) for m in target.modules() if type(m) is torch.nn.Linear)  # every row
    runner.close()
    assert all("forward" not in vars(m) for m in target.modules() if type(m) is torch.nn.Linear)


def test_auto_is_on_for_16_bit_cpu_models_only():
    """generate's default: the mode where it decodes as fast as the fast path (bf16/fp16 CPU)."""
    for dtype, kw, want in ((torch.bfloat16, {}, True), (torch.float16, {}, True), (torch.float32, {}, False),
                            (torch.bfloat16, {"linear": "torch"}, False)):
        runner = ModelRunner(tiny_causal_lm("llama", dtype=dtype), 1, 8, batch_invariant="auto", **kw)
        assert runner.batch_invariant is want, (dtype, kw)
        runner.close()
    target = tiny_causal_lm("llama", dtype=torch.bfloat16)
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8]]
    default, _ = generate(target, prompts, method="ngram", max_new_tokens=N_NEW, eos_token_id=[])
    on, _ = generate(target, prompts, method="ngram", max_new_tokens=N_NEW, eos_token_id=[], batch_invariant=True)
    assert default.tolist() == on.tolist()


def _ar_logits(model, prompt, path, **kw):
    """AR's logits after the last token of ``path``, fed one one-row step at a time. -> [V]."""
    runner = ModelRunner(model, 1, len(prompt) + len(path) + 8, **kw)
    try:
        runner.prefill([prompt])
        for tok in path:
            row = runner.forward(torch.tensor([[tok]]), torch.tensor([[-1]], dtype=torch.int32))[0, 0]
            runner.keep(torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
        return row
    finally:
        runner.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", [{}, {"kv_layout": "paged", "page_size": 8}], ids=["contiguous", "paged"])
def test_block_logits_have_the_bits_of_ar_steps(layout, dtype):
    # A prompt that crosses the CPU attention's 96-key tile and a tree block whose paths cross it
    # again: with the mode, every node's logits equal AR's after its path, bit for bit. In fp32 the
    # fast path's differ (the control that shows the comparison can fail; in bf16 the rounding of
    # each output to 8 bits hides most differences of a model this small).
    target = tiny_causal_lm("llama", hidden_size=96, num_layers=2, seed=4, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128, (93,), generator=gen).tolist()
    parents = [-1, 0, 1, 1, 2, 4, 3, 6, 5]
    tokens = torch.randint(0, 128, (len(parents),), generator=gen).tolist()
    paths = []  # node i's path from the root (parents come before their children)
    for p in parents:
        paths.append((paths[p] if p >= 0 else []) + [len(paths)])
    differs = False
    for invariant in (True, False):
        runner = ModelRunner(target, 1, 128, batch_invariant=invariant, **layout)
        runner.prefill([prompt])
        block = runner.forward(torch.tensor([tokens]), torch.tensor([parents], dtype=torch.int32))[0]  # [T, V]
        runner.close()
        for i, path in enumerate(paths):
            ar = _ar_logits(target, prompt, [tokens[j] for j in path], batch_invariant=invariant, **layout)
            if invariant:
                assert torch.equal(block[i], ar), f"node {i}"
            else:
                differs |= not torch.equal(block[i], ar)
    if dtype == torch.float32:
        assert differs, "the fast path matched AR bit for bit too: this comparison would not catch a regression"


def test_compiled_methods_emit_compiled_ar_tokens():
    # Compiled forwards (one graph per bucket of 1, 2, 4, ... rows) with the mode: a speculative
    # method's blocks meet other buckets than AR's one-row steps and must still give AR's tokens.
    # (Compiled and eager texts may differ from each other: inductor fuses the norms and elementwise
    # ops with other roundings than eager torch; each is its own reference.)
    target = tiny_causal_lm("llama", hidden_size=96, num_layers=2, seed=4, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (93, 40, 7)]
    kw = dict(max_new_tokens=16, eos_token_id=[], batch_invariant=True, compile=True)
    ar, _ = generate(target, prompts, method="ar", **kw)
    out, m = generate(target, prompts, method="ngram", adaptive=False, **kw)
    assert out.tolist() == ar.tolist()
    assert m.num_target_forwards < 16


def test_smollm2_bf16_methods_emit_ar_tokens():
    # The real target where installed (converted in the specops cache; nothing is downloaded): a
    # chat question, 64 tokens, bf16 - where the fast path's blocks drift from AR's text
    # (docs/batch_invariance.md has the six-category table, bench/batch_invariant.py).
    import os

    from specops import models

    if not os.path.exists(os.path.join(models.cache_dir(), "smollm2-135m", "tokenizer.json")):
        pytest.skip("SmolLM2 not converted in the specops cache (specops.models.load('smollm2-135m') once)")
    model, tok = models.load("smollm2-135m", dtype=torch.bfloat16)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Summarise the water cycle for a child."}],
                                     tokenize=False, add_generation_prompt=True)
    kw = dict(tokenizer=tok, max_new_tokens=64, eos_token_id=[], batch_invariant=True)
    ar, _ = generate(model, prompt, method="ar", **kw)
    for method in ("ngram", "tsd"):
        out, _ = generate(model, prompt, method=method, kv_layout="paged" if method == "tsd" else "contiguous", **kw)
        assert out.tolist() == ar.tolist(), method
