"""Target feature capture for EAGLE-style drafters: ``ModelRunner(keep_features=True).features[b, p]``
is the LM head's input at committed position ``p``, after prefill and after every ``keep`` (chain
prefixes and tree paths alike, ragged batches); without ``keep_features``
no hook exists; ``generate`` turns it on from the drafter's ``needs_target_features``."""
import pytest
import torch

from specops.decoding import api, loop, methods
from specops.decoding.draft_lm import DraftLM
from specops.decoding.sampling import SamplingConfig
from specops.decoding.stopping import Stopper
from specops.testing import perturbed_copy, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    target = tiny_causal_lm("llama", seed=0)
    return target, perturbed_copy(target, 0.15, seed=1)


def head_inputs(model, ids):
    """The LM head's input over a plain HF forward (stock sdpa attention, no cache).
    Shape: ids list of L ints -> fp32 [L, H]."""
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        hook.remove()
        model.set_attn_implementation(before)
    return seen[0][0].float()


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 3}), ("tsd", {}), ("ar", {})])
def test_features_at_committed_positions_equal_plain_forward_hidden_states(models, method, params, monkeypatch):
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
    tlm = loop.TargetLM(models[0], 2, max_len, keep_features=True)
    dlm = DraftLM(models[1], 2, max_len + drafter.draft_budget() + drafter.tree_budget() + 1) \
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
    assert tlm.features.dtype == next(models[0].parameters()).dtype
    for b, p in enumerate(prompts):
        # The last step may commit accepted tokens past the max_new_tokens cut: compare the
        # positions whose tokens were emitted (all but the pending one).
        n = len(p) + len(gen[b]) - 1
        assert n <= lens[b] and n >= len(p) + 10
        want = head_inputs(models[0], (p + gen[b])[:n])
        torch.testing.assert_close(tlm.features[b, :n].float(), want, atol=1e-5, rtol=1e-5)


def test_no_hook_and_no_buffer_without_keep_features(models):
    target, _ = models
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


def test_generate_turns_features_on_for_drafters_that_need_them(models, monkeypatch):
    target, _ = models
    seen = []

    class FeatureDrafter(methods.NullDrafter):
        needs_target_features = True

        def propose(self, state):
            lens = state.target.lens.tolist()
            seen.append((state.target.features is not None, lens))
            return super().propose(state)

    monkeypatch.setattr(methods, "make", lambda name, **kw: FeatureDrafter(**kw))
    hooks = len(target.get_output_embeddings()._forward_pre_hooks)
    api.generate(target, [[1, 2, 3, 4]], method="ar", max_new_tokens=3, eos_token_id=[])
    assert seen == [(True, [4]), (True, [5])]
    assert len(target.get_output_embeddings()._forward_pre_hooks) == hooks  # removed afterwards
