"""The draft models at run time, as the decoding loop and ``specops.models`` load them; training is
:mod:`specops.distill`, which imports this module (never the reverse).

Two ``arch``s: ``"feature"`` (EAGLE-style, :func:`feature_draft_class`) and ``"lm"`` (a few-layer
``LlamaForCausalLM``), both on the target's frozen embedding and scored by :class:`SubsetLMHead`
(docs/models.md §smollm2-135m-draft): the target's 49,152 x 576 tied head costs 28M MACs per token,
as much as eight decoder layers. A draft directory: ``model.safetensors`` (decoder layers, ``fc``,
final norm, ``keep``) and ``config.json``."""
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from . import extension
from .ops.linear import cpu_kernel, pack_weight, packing_pays

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
RECORD = "training.json"
ARCHS = ("lm", "feature")
ARCH = "feature"  # specops_arch of the feature draft
DRAFTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "drafts")  # the shipped drafts
SUFFIX = "-draft"


class SubsetLMHead(nn.Module):
    """Tied LM head that scores only ``keep`` rows of ``weight``.

    Shape: weight [V, H] (shared with the input embedding), keep int64 [Vd];
    forward: hidden [..., H] -> logits [..., V] (``-inf`` outside ``keep``);
    sub_logits: hidden [..., H] -> logits [..., Vd]."""

    def __init__(self, weight, keep):
        super().__init__()
        self.weight = weight
        self.register_buffer("keep", keep.to(torch.int64), persistent=False)
        self._sub = self._sub_key = None
        self._packed = None  # pack_weight(self._sub) where packing pays (bf16 on an AVX-512 CPU)

    def sub_weight(self):
        w = self.weight
        if self.training or torch.is_grad_enabled() and w.requires_grad:
            return w.index_select(0, self.keep)
        # The gathered rows are cached between decode steps; the key notices dtype/device moves
        # and in-place updates of the shared weight (not of an inference tensor: it has no version).
        key = (w.data_ptr(), w.dtype, w.device, None if w.is_inference() else w._version, self.keep.data_ptr())
        if self._sub_key != key:
            self._sub = w.detach().index_select(0, self.keep)
            self._packed = (pack_weight(self._sub) if self._sub.dtype == torch.bfloat16 and w.device.type == "cpu"
                            and packing_pays() else None)
            self._sub_key = key
        return self._sub

    def sub_logits(self, hidden):
        w = self.sub_weight()
        if (not torch.is_grad_enabled() and hidden.device.type == "cpu" and hidden.dtype == w.dtype
                and hidden.dtype in (torch.bfloat16, torch.float16) and type(hidden) is torch.Tensor
                and extension.cpu_ext is not None):
            # specops.linear reads the head once for all rows: a draft step's 16k-row head took 1.5 ms
            # through torch's bf16 GEMM against ~0.8 from the packed copy (2-core Xeon, AVX-512).
            y = cpu_kernel(hidden.reshape(-1, hidden.shape[-1]).contiguous(), w, None, self._packed)  # [M, Vd]
            return y.view(*hidden.shape[:-1], w.shape[0])
        return F.linear(hidden, w)

    def forward(self, hidden):
        sub = self.sub_logits(hidden)
        out = sub.new_full(sub.shape[:-1] + (self.weight.shape[0],), float("-inf"))
        return out.index_copy_(-1, self.keep, sub)


def feature_draft_class():
    """``FeatureDraft`` (:mod:`specops.feature_draft`), imported at the first call (importing specops
    imports no transformers models); module-level, so its compiled graphs can be saved."""
    from .feature_draft import FeatureDraft

    return FeatureDraft


def is_feature_draft(model):
    return getattr(model, "specops_arch", None) == ARCH


def build_draft(config, keep, embedding, arch="lm"):
    """A LlamaForCausalLM (``arch="feature"``: :func:`feature_draft_class`) of ``config`` whose head is
    a :class:`SubsetLMHead` over ``embedding``. Shape: keep int [Vd]; embedding [V, H] (the target's)."""
    from transformers import LlamaForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"draft arch must be one of {ARCHS}, got {arch!r}")
    model = (feature_draft_class() if arch == "feature" else LlamaForCausalLM)(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embedding.to(model.model.embed_tokens.weight.dtype))
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head = SubsetLMHead(model.model.embed_tokens.weight, torch.as_tensor(keep))
    return model


def read_config(draft_dir):
    """(LlamaConfig, the ``specops_draft`` record) of a draft directory."""
    from transformers import LlamaConfig

    with open(os.path.join(draft_dir, CONFIG)) as f:
        raw = json.load(f)
    meta = raw.pop("specops_draft", {})
    return LlamaConfig.from_dict(raw), meta


def load_draft_dir(draft_dir, embedding, dtype=torch.bfloat16):
    """Loads a draft directory (``specops distill``'s export) onto the target's ``embedding`` ([V, H])."""
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


def shipped_draft_dir(name):
    """The package folder of the shipped draft ``name`` ("<target>-draft"), or None if none ships."""
    path = os.path.join(DRAFTS_DIR, name)
    return path if os.path.exists(os.path.join(path, WEIGHTS)) else None


def shipped_drafts():
    """The names of the drafts that ship in the package."""
    return sorted(d for d in os.listdir(DRAFTS_DIR) if shipped_draft_dir(d)) if os.path.isdir(DRAFTS_DIR) else []


__all__ = ["ARCHS", "SubsetLMHead", "build_draft", "feature_draft_class", "is_feature_draft", "load_draft_dir",
           "read_config", "shipped_draft_dir", "shipped_drafts"]
