"""The feature draft (EAGLE-style): one decoder layer that reads the target's own final hidden state.

Why this shape (measured on this CPU, see training.json of the shipped draft): a stand-alone
2-layer LM on the target's embedding agreed with the target on only 25% of greedy tokens, because
predicting the next token from tokens alone is the target's whole job. The target's final hidden
state ``f_p`` (the input of its LM head at position ``p``) already encodes what it "thinks"; given
``f_p`` and the token ``x_{p+1}`` actually chosen from it, predicting ``f_{p+1}`` (and so
``x_{p+2}``) is a far easier problem for one layer (EAGLE, Li et al. 2024).

At position ``p`` the draft's input is ``fc([embed(x_{p+1}); f_p])``; one Llama decoder layer and a
final norm give ``g_p``, the draft's estimate of ``f_{p+1}``; the target's tied LM head restricted to
the draft vocabulary (``SubsetLMHead``) scores it. Deeper draft tokens feed the draft's own ``g``
in place of the target's ``f``. Verification stays exact: the draft only proposes.

Trained teacher-forced only, the draft never sees its own ``g`` as input, and its second chain token
agreed with the target half as often as its first. ``--ttt-depth D`` (EAGLE-3's training-time test,
``train.ttt_mask``) unrolls D chain tokens in one forward: block d reads block d-1's outputs and
attends to the teacher-forced context plus its own chain, exactly as the runner's tree attention
lets a depth-d node attend.

The model is a ``LlamaForCausalLM`` (so the specops runner drives it: static cache, tree attention,
positions = prefix + depth) whose ``forward`` takes the feature rows from ``features=`` or, when the
runner calls it with ids only, from ``feature_input`` set just before the call. The predicted
features of the latest call are left in ``last_features``.
"""
import torch
from torch import nn

ARCH = "feature"


def _llama():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM


def feature_draft_class():
    """``FeatureDraft``, built lazily so importing specops does not import transformers models."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from transformers.modeling_outputs import CausalLMOutputWithPast

    base = _llama()

    class FeatureDraft(base):
        """A 1..K-layer Llama over ``fc([embed(token); target feature])``.

        Shape: forward(input_ids [B, T], features [B, T, H] or feature_input) -> logits [B, T, V];
        ``last_features`` [B, T, H] (post-norm, the estimate of the target's next feature)."""

        specops_arch = ARCH

        def __init__(self, config):
            super().__init__(config)
            H = config.hidden_size
            self.fc = nn.Linear(2 * H, H, bias=True)
            self.feature_input = None
            self.last_features = None

        def hidden(self, input_ids, features, **kwargs):
            """Shape: input_ids [B, T], features [B, T, H] -> (post-norm hidden [B, T, H], HF output)."""
            emb = self.model.embed_tokens(input_ids)
            if features.shape[:2] != emb.shape[:2] or features.shape[-1] != emb.shape[-1]:
                raise ValueError(f"features: expected shape {tuple(emb.shape)}, got {tuple(features.shape)}")
            x = self.fc(torch.cat([emb, features.to(emb.dtype)], dim=-1))
            out = self.model(inputs_embeds=x, **kwargs)
            self.last_features = out.last_hidden_state
            return out.last_hidden_state, out

        def forward(self, input_ids=None, position_ids=None, past_key_values=None, use_cache=None,
                    features=None, attention_mask=None, logits_to_keep=None, **kwargs):
            feats = features if features is not None else self.feature_input
            if feats is None:
                raise ValueError("a feature draft needs the target's features: pass features= or set "
                                 "feature_input (shape [B, T, hidden]) before calling it")
            h, out = self.hidden(input_ids, feats, position_ids=position_ids, past_key_values=past_key_values,
                                 use_cache=use_cache, attention_mask=attention_mask)
            if isinstance(logits_to_keep, torch.Tensor):  # [B, k] row indices (the runner's last rows)
                h = torch.take_along_dim(h, logits_to_keep[..., None].to(h.device), dim=1)
            elif isinstance(logits_to_keep, int) and logits_to_keep > 0:
                h = h[:, -logits_to_keep:]
            return CausalLMOutputWithPast(logits=self.lm_head(h), past_key_values=out.past_key_values)

    _CLASS = FeatureDraft
    return FeatureDraft


_CLASS = None


def is_feature_draft(model):
    return getattr(model, "specops_arch", None) == ARCH


def init_feature_draft(draft, target, layer_map):
    """Copies target decoder layers ``layer_map`` into the draft's and the final norm; ``fc`` starts
    as "take the feature" (identity on the feature half, small on the embedding half), so step 0
    already behaves like the target's last layers applied to its own feature."""
    from .model import init_from_target

    init_from_target(draft, target, layer_map)
    H = draft.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, H:].copy_(torch.eye(H))
        draft.fc.weight[:, :H].normal_(0.0, 0.02)
        draft.fc.bias.zero_()
    return draft
