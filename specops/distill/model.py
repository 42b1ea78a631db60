"""The draft models ``specops distill`` trains, scored by the target's tied LM head restricted to a
subset of the vocabulary. Two architectures (``arch``):

* ``"feature"`` (the default, :mod:`specops.distill.feature`): EAGLE-style, one decoder layer over
  ``fc([embed(token); target final hidden state])``. It needs the target's hidden states, which the
  loop keeps for it (``TargetLM(keep_features=True)``, ``specops.decoding.eagle.FeatureDraftLM``).
* ``"lm"``: a stand-alone ``LlamaForCausalLM`` of a few layers on the target's frozen embedding; it
  runs ahead on its own KV cache without the target's states, but agreed on only ~25% of greedy
  tokens in our runs (the shipped feature draft: 0.43, at a smaller cost), so it is the fallback.

Shared by both:

* The target's 49,152 x 576 tied head is 28M MACs per token, as much as eight decoder layers; a
  draft that scores all of it cannot be cheap. ``SubsetLMHead`` scores only the ``keep`` rows (the
  tokens the target actually predicts, ranked from the distillation data) and returns full-vocabulary
  logits with ``-inf`` elsewhere, so the loop still sees a draft with the target's vocabulary and
  verification stays exact: the draft merely never proposes a dropped token.
* The embedding is the target's own (frozen, not shipped: it is read from the target's cache when
  the draft loads), so the shipped weights are only the decoder layers, ``fc``, the final norm and
  ``keep``.
"""
import copy
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
RECORD = "training.json"
ARCHS = ("lm", "feature")


class SubsetLMHead(nn.Module):
    """Tied LM head that scores only ``keep`` rows of ``weight``.

    Shape: weight [V, H] (shared with the input embedding), keep int64 [Vd];
    forward: hidden [..., H] -> logits [..., V] (``-inf`` outside ``keep``);
    sub_logits: hidden [..., H] -> logits [..., Vd]."""

    def __init__(self, weight, keep):
        super().__init__()
        self.weight = weight
        self.register_buffer("keep", keep.to(torch.int64), persistent=False)
        self._sub = None
        self._sub_key = None

    def sub_weight(self):
        w = self.weight
        if self.training or torch.is_grad_enabled() and w.requires_grad:
            return w.index_select(0, self.keep)
        # The gathered rows are cached between decode steps; the key notices dtype/device moves
        # and in-place updates of the shared weight.
        key = (w.data_ptr(), w.dtype, w.device, w._version, self.keep.data_ptr())
        if self._sub_key != key:
            self._sub = w.detach().index_select(0, self.keep)
            self._sub_key = key
        return self._sub

    def sub_logits(self, hidden):
        return F.linear(hidden, self.sub_weight())

    def forward(self, hidden):
        sub = self.sub_logits(hidden)
        out = sub.new_full(sub.shape[:-1] + (self.weight.shape[0],), float("-inf"))
        return out.index_copy_(-1, self.keep, sub)


def draft_config(target_config, num_layers):
    """The draft's LlamaConfig: the target's, with ``num_layers`` decoder layers."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    cfg.tie_word_embeddings = True
    for attr in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(cfg, attr):
            try:
                delattr(cfg, attr)
            except AttributeError:
                pass
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    return cfg


def _llama_class():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM


def build_draft(config, keep, embedding, arch="lm"):
    """A LlamaForCausalLM with ``config`` whose head is a :class:`SubsetLMHead` over ``embedding``;
    ``arch`` "feature" builds the EAGLE-style :mod:`feature draft <specops.distill.feature>`.

    Shape: keep int [Vd]; embedding [V, H] (the target's input embedding, frozen)."""
    if arch not in ARCHS:
        raise ValueError(f"draft arch must be one of {ARCHS}, got {arch!r}")
    if arch == "feature":
        from .feature import feature_draft_class

        model = feature_draft_class()(config)
    else:
        model = _llama_class()(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embedding.to(model.model.embed_tokens.weight.dtype))
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head = SubsetLMHead(model.model.embed_tokens.weight, torch.as_tensor(keep))
    return model


def init_from_target(draft, target, layer_map):
    """Copies target decoder layers ``layer_map[i]`` into draft layer ``i``, and the final norm."""
    with torch.no_grad():
        for i, j in enumerate(layer_map):
            src = target.model.layers[j].state_dict()
            draft.model.layers[i].load_state_dict({k: v.to(torch.float32) for k, v in src.items()})
        draft.model.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
    return draft


def trainable_state(draft):
    """What the artefact ships: every tensor except the (target-owned) embedding."""
    return {k: v for k, v in draft.state_dict().items()
            if not k.startswith("model.embed_tokens") and not k.startswith("lm_head")}


def save_draft(draft, out_dir, *, target, record, dtype=torch.bfloat16):
    """Writes ``model.safetensors`` (layers, norm, ``lm_head.keep``), ``config.json`` and
    ``training.json`` into ``out_dir``."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in trainable_state(draft).items()}
    tensors["lm_head.keep"] = draft.lm_head.keep.to(torch.int32).contiguous()
    tmp = os.path.join(out_dir, WEIGHTS + ".tmp")
    save_file(tensors, tmp, metadata={"format": "pt", "specops_target": target})
    os.replace(tmp, os.path.join(out_dir, WEIGHTS))
    cfg = draft.config.to_dict()
    cfg["specops_draft"] = {"target": target, "draft_vocab": int(draft.lm_head.keep.numel()),
                            "arch": getattr(draft, "specops_arch", "lm"),
                            "embedding": "target (frozen, tied, read from the target at load time)"}
    _write_json(os.path.join(out_dir, CONFIG), cfg)
    _write_json(os.path.join(out_dir, RECORD), record)


def _write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(path + ".tmp", path)


def read_config(draft_dir):
    from transformers import LlamaConfig

    with open(os.path.join(draft_dir, CONFIG)) as f:
        raw = json.load(f)
    meta = raw.pop("specops_draft", {})
    return LlamaConfig.from_dict(raw), meta


def load_draft_dir(draft_dir, embedding, dtype=torch.bfloat16):
    """Loads a draft written by :func:`save_draft` onto the target's ``embedding`` ([V, H])."""
    from safetensors.torch import load_file

    config, meta = read_config(draft_dir)
    tensors = load_file(os.path.join(draft_dir, WEIGHTS))
    keep = tensors.pop("lm_head.keep").to(torch.int64)
    if embedding.shape[0] != config.vocab_size:
        raise ValueError(f"the draft in {draft_dir} has a {config.vocab_size}-token vocabulary but the "
                         f"target's embedding has {embedding.shape[0]} rows")
    model = build_draft(config, keep, embedding, arch=meta.get("arch", "lm"))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.startswith(("model.embed_tokens", "lm_head"))]
    if missing or unexpected:
        raise ValueError(f"draft weights in {draft_dir} do not match its config: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(dtype).eval()
