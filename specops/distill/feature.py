"""The feature draft (EAGLE-style): one decoder layer that reads the target's own final hidden state.

Why (measured on this CPU, training.json of the shipped draft): a stand-alone 2-layer LM on the
target's embedding agreed with the target on only 25% of greedy tokens, since predicting the next
token from tokens alone is the target's whole job. The target's final hidden state ``f_p`` (its
LM head's input at ``p``) already encodes what it "thinks"; from ``f_p`` and the token
``x_{p+1}`` chosen from it, predicting ``f_{p+1}`` (so ``x_{p+2}``) is far easier for one layer
(EAGLE, Li et al. 2024). The architecture: :mod:`specops.draft_models`.

Trained teacher-forced only, the draft never sees its own ``g`` as input, and its second chain
token agreed half as often as its first. ``--ttt-depth D`` (EAGLE-3's training-time test,
``train.ttt_mask``) unrolls D chain tokens in one forward: block d reads block d-1's outputs and
attends to the teacher-forced context plus its own chain, as the runner's tree attention lets a
depth-d node attend.

The model class is run-time code (:func:`specops.draft_models.feature_draft_class`, a
``LlamaForCausalLM`` the runner drives); this module holds what training adds to it."""
import torch

from ..draft_models import is_feature_draft  # noqa: F401 (re-exported)
from .model import init_from_target


def init_feature_draft(draft, target, layer_map):
    """Copies target decoder layers ``layer_map`` into the draft's and the final norm; ``fc`` starts
    as "take the feature" (identity on the feature half, small on the embedding half), so step 0
    already behaves like the target's last layers applied to its own feature."""
    init_from_target(draft, target, layer_map)
    H = draft.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, H:].copy_(torch.eye(H))
        draft.fc.weight[:, :H].normal_(0.0, 0.02)
        draft.fc.bias.zero_()
    return draft
