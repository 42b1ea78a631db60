"""The feature (EAGLE-style) draft: its training step on a tiny random Llama target, and the runtime
(FeatureDraftLM) feeding the right feature rows into cached tree blocks."""
import torch

from specops.decoding.eagle import FeatureDraftLM
from specops.distill import data
from specops.distill.feature import init_feature_draft, is_feature_draft
from specops.distill.model import build_draft, draft_config
from specops.distill.train import flatten_rows, train

from test_distill import V, shards_from, tiny_target


def feature_draft(target, keep=None, seed=1):
    torch.manual_seed(seed)
    keep = torch.arange(V) if keep is None else keep
    d = build_draft(draft_config(target.config, 1), keep, target.model.embed_tokens.weight.detach(), arch="feature")
    return init_feature_draft(d, target, [target.config.num_hidden_layers - 1]).float()


def feature_shards(target, **kw):
    out = shards_from(target, **kw)
    for s in out:
        data.add_features(target, s)
    return out


def test_shards_carry_the_targets_final_hidden_states():
    target = tiny_target()
    (s,) = feature_shards(target, n_shards=1, rows=2, L=9)
    with torch.no_grad():
        h = target.model(s["tokens"].long()).last_hidden_state
    torch.testing.assert_close(s["feats"].float(), h, atol=2e-2, rtol=2e-2)
    t = data.label_text_rows(target, [("r", r.tolist()) for r in s["tokens"]], 4, 0, features=True)
    assert torch.equal(t["feats"], s["feats"])


def test_feature_draft_learns_the_next_feature_and_token(tmp_path):
    target = tiny_target()
    shards = feature_shards(target, n_shards=4)
    keep = data.rank_vocab(shards, V, 200, always=(2,))
    d = feature_draft(target, keep)
    assert is_feature_draft(d)
    state = train(d, flatten_rows(shards), [], str(tmp_path), steps=25, batch_rows=4, lr=3e-3, warmup=2, seed=0,
                  amp=False, ckpt_every=100, eval_every=5, feature_noise=0.1)
    hist = state["history"]
    assert hist[-1]["loss"] < hist[0]["loss"] - 0.5
    assert hist[-1]["train_agree"] > hist[0]["train_agree"]


class _Target:
    """What FeatureDraftLM reads from a TargetLM: features [B, max_len, H]."""

    def __init__(self, feats):
        self.features = feats


@torch.no_grad()
def test_cached_tree_blocks_read_target_features_then_predicted_ones():
    target = tiny_target()
    d = feature_draft(target).eval()
    seq = torch.randint(3, V, (1, 11))
    feats = torch.zeros(1, 40, 64)
    feats[:, :11] = target.model(seq).last_hidden_state
    lm = FeatureDraftLM(d, 1, 40, _Target(feats))
    prompt = seq[0, :6].tolist()
    lm.prefill([prompt])
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
    from specops.decoding.api import generate

    target = tiny_target(seed=3)
    d = feature_draft(target, seed=4).eval()
    prompts = [[5, 9, 33, 4, 71, 12], [8, 100, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    ref, _ = generate(target, prompts, method="ar", max_new_tokens=14, eos_token_id=[])
    for method in ("sd", "tsd", "opt-tree", "specinfer", "ouroboros", "mjsd"):
        kw = {"merge_tau": 0} if method == "gsd" else {}
        out, m = generate(target, prompts, draft=d, method=method, max_new_tokens=14, eos_token_id=[], **kw)
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
    from specops.distill.train import _feature_forward

    target = tiny_target()
    (s,) = feature_shards(target, n_shards=1, rows=2, L=11)
    d = feature_draft(target).eval()
    tokens, feats = s["tokens"].long(), s["feats"].float()
    mask = torch.ones_like(tokens, dtype=torch.bool)
    h, ms, _ = _feature_forward(d, tokens, mask, feats, 0.0, 0.1, depth=2)
    B, M = tokens.shape[0], tokens.shape[1] - 1
    assert ms.shape == (2, B, M) and not ms[1, :, 0].any() and ms[1, :, 1:].all()
    h1_ref, _ = d.hidden(tokens[:, 1:], feats[:, :-1])
    n1 = int(ms[0].sum())
    torch.testing.assert_close(h[:n1].reshape(B, M, -1), h1_ref, atol=1e-4, rtol=1e-4)
    h2 = h[n1:].reshape(B, M - 1, -1)
    for i in (1, 4, M - 1):
        ctx_f = feats[:, :i]
        node_f = h1_ref[:, i - 1: i]
        ids = torch.cat([tokens[:, 1: i + 1], tokens[:, i + 1: i + 2]], dim=1)
        ref, _ = d.hidden(ids, torch.cat([ctx_f, node_f], dim=1))
        torch.testing.assert_close(h2[:, i - 1], ref[:, -1], atol=1e-4, rtol=1e-4)


def test_unrolled_training_lowers_the_loss_of_deeper_tokens(tmp_path):
    from specops.distill.train import evaluate_rows

    target = tiny_target()
    shards = feature_shards(target, n_shards=4)
    keep = torch.arange(V)
    d = feature_draft(target, keep)
    rows = flatten_rows(shards)
    full2sub = torch.arange(V)
    before = evaluate_rows(d, rows, full2sub, False, depth=3)
    state = train(d, rows, rows[:4], str(tmp_path), steps=25, batch_rows=4, lr=3e-3, warmup=2, seed=0,
                  amp=False, ckpt_every=100, eval_every=5, feature_noise=0.1, depth=3)
    after = evaluate_rows(d, rows, full2sub, False, depth=3)
    assert len(before) == 3 and len(state["history"][-1]["val_agree_by_depth"]) == 3
    assert state["history"][-1]["loss"] < state["history"][0]["loss"] - 0.5
    assert after[1] > before[1] and after[2] > before[2]
