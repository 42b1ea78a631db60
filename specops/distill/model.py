"""What training adds to :mod:`specops.draft_models` (the run-time classes and loading): the draft
config, initialisation from the target's layers, the export. The ``"lm"`` architecture is the
fallback (why: :mod:`specops.distill.feature`; docs/models.md §Drafts)."""
import contextlib
import copy
import json
import os

import torch

from ..draft_models import ARCHS, CONFIG, RECORD, WEIGHTS, build_draft, load_draft_dir  # noqa: F401 (re-exported)


def draft_config(target_config, num_layers):
    """The draft's LlamaConfig: the target's, with ``num_layers`` decoder layers."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    cfg.tie_word_embeddings = True
    for attr in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        with contextlib.suppress(AttributeError):
            delattr(cfg, attr)
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    return cfg


def init_from_target(draft, target, layer_map):
    """Copies target decoder layers ``layer_map[i]`` into draft layer ``i``, and the final norm."""
    with torch.no_grad():
        for i, j in enumerate(layer_map):
            src = target.model.layers[j].state_dict()
            draft.model.layers[i].load_state_dict({k: v.to(torch.float32) for k, v in src.items()})
        draft.model.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
    return draft


def trainable_state(draft):
    """What the artefact ships: every tensor but the target-owned embedding and head."""
    owned = ("model.embed_tokens", "lm_head")
    return {k: v for k, v in draft.state_dict().items() if not k.startswith(owned)}


def save_draft(draft, out_dir, *, target, record, dtype=torch.bfloat16):
    """Writes ``model.safetensors`` (layers, norm, ``lm_head.keep``), ``config.json``, ``training.json``."""
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
    write_json(os.path.join(out_dir, CONFIG), cfg)
    write_json(os.path.join(out_dir, RECORD), record)


def write_json(path, obj, indent=2):
    """``obj`` as JSON in ``path``, written to a temp name and renamed (never a half-written file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")
    os.replace(path + ".tmp", path)
