"""The EAGLE-style feature draft's model class, imported lazily by
:func:`specops.draft_models.feature_draft_class`. Its ``forward`` takes the feature rows from
``features=`` or, called with ids only, from ``feature_input`` set just before; the latest call's
predicted features are left in ``last_features``."""
import torch
from torch import nn
from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast


class FeatureDraft(LlamaForCausalLM):
    """A 1..K-layer Llama over ``fc([embed(token); target feature])``.

    Shape: forward(input_ids [B, T], features [B, T, H] or feature_input) -> logits [B, T, V];
    ``last_features`` [B, T, H] (post-norm, the estimate of the target's next feature)."""

    specops_arch = "feature"  # draft_models.ARCH (that module imports this one, not the reverse)

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
        # kwargs: what the runner passes down to the attention (the block's ``specops_block``)
        h, out = self.hidden(input_ids, feats, position_ids=position_ids, past_key_values=past_key_values,
                             use_cache=use_cache, attention_mask=attention_mask, **kwargs)
        if isinstance(logits_to_keep, torch.Tensor):  # [B, k] row indices (the runner's last rows)
            h = torch.take_along_dim(h, logits_to_keep[..., None].to(h.device), dim=1)
        elif isinstance(logits_to_keep, int) and logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.lm_head(h), past_key_values=out.past_key_values)
