"""What training adds to the feature draft (EAGLE-style: one decoder layer over the target's own
final hidden state; the class is run-time code, :func:`specops.draft_models.feature_draft_class`).

Why (measured here, the shipped draft's training.json): a stand-alone 2-layer LM agreed with the
target on only 25% of greedy tokens, predicting from tokens alone being the target's whole job. The
target's final hidden state ``f_p`` already encodes what it "thinks"; from ``f_p`` and the token
``x_{p+1}`` chosen from it, predicting ``f_{p+1}`` (so ``x_{p+2}``) is far easier for one layer
(EAGLE, Li et al. 2024). Trained teacher-forced only, the draft never reads its own predictions and
its second chain token agreed half as often as its first: hence ``--ttt-depth`` (``train.ttt_mask``)."""
import torch

from ..draft_models import is_feature_draft  # noqa: F401 (re-exported)
from .model import init_from_target


def init_feature_draft(draft, target, layer_map):
    """:func:`init_from_target`, with ``fc`` starting as "take the feature" (identity on the feature
    half, small on the embedding half): step 0 is the target's last layers on its own feature."""
    init_from_target(draft, target, layer_map)
    H = draft.config.hidden_size
    with torch.no_grad():
        draft.fc.weight[:, H:].copy_(torch.eye(H))
        draft.fc.weight[:, :H].normal_(0.0, 0.02)
        draft.fc.bias.zero_()
    return draft
