"""``specops distill``: collect -> choose the draft vocabulary -> train -> export, each resumable.

Layout of ``out_dir``::

    data/plan.json          the arguments that fix the data (a resumed run must match them)
    data/shard_NNNNN.pt     distillation shards (data.py)
    data/manifest.json      every corpus item and prompt used
    data/keep.pt            the draft vocabulary (token ids)
    ckpt/last.pt, best.pt   training checkpoints (train.py)
    draft/                  the exported draft (model.safetensors, config.json, training.json)
"""
import collections
import json
import os
import platform
import time

import torch

from . import corpus, data
from .feature import init_feature_draft
from .model import ARCHS, build_draft, draft_config, init_from_target, save_draft, write_json
from .train import Progress, flatten_rows, train


class UnsupportedTarget(ValueError):
    """The target cannot be distilled by this command (the message says why and what can be)."""


SUPPORTED_MODEL_TYPES = ("llama",)


def _settings(path, settings, refusal, ignore=()):
    """Records ``settings`` in ``path`` unless it holds others (a resumed run must match): ValueError
    ``refusal`` with ``{diff}``, the keys that differ (``ignore``: keys that may)."""
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        diff = sorted(k for k in set(old) | set(settings) if k not in ignore and old.get(k) != settings.get(k))
        if diff:
            raise ValueError(refusal.replace("{diff}", ", ".join(diff)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, settings, indent=1)


def collect(target, tokenizer, data_dir, plan, progress):
    """Writes the shards of ``plan`` that are missing. Returns the manifest."""
    # The shard plan, prompts and corpus rows are prefix-stable in the shard count, so a run may be
    # resumed with a different --tokens (extending the data, or training on a prefix of it).
    _settings(os.path.join(data_dir, "plan.json"), plan, f"{data_dir} holds data collected with other settings "
              "({diff}); use another --out or the same settings to resume", ignore=("shards",))
    kinds = data.shard_plan(plan["shards"], plan["gen_frac"])
    src, topics = corpus.stdlib_sources(limit=plan["max_stdlib_files"]), corpus.pydoc_topics()
    pools = [("stdlib-source", src), ("pydoc-topics", topics), ("stdlib-docstrings", corpus.docstrings(src)),
             ("package-docs", corpus.package_docs())]
    rows_per_text = max(1, plan["shard_tokens"] // plan["row_len"])
    text_rows = data.TextRows(tokenizer, [(name, items) for name, items in pools if items], plan["row_len"],
                              plan["seed"])  # pools: [(name, [(item name, text), ...]), ...]
    n_gen = kinds.count("gen")
    prompts = corpus.make_prompts(n_gen * plan["gen_batch"], src, seed=plan["seed"], pydoc=topics,
                                  mix=plan.get("prompt_mix", "v1"))
    temps, features = plan["gen_temperatures"], plan.get("features", False)
    t0, done = time.perf_counter(), 0
    todo = [i for i in range(len(kinds)) if not os.path.exists(data.shard_path(data_dir, i))]
    progress.log(f"data: {len(kinds)} shards ({n_gen} generated, {len(kinds) - n_gen} corpus), "
                 f"{len(kinds) - len(todo)} already collected")
    for i, kind in enumerate(kinds):
        path, ts = data.shard_path(data_dir, i), time.perf_counter()
        rows = text_rows.take(rows_per_text) if kind == "text" else None  # even when the shard exists
        if os.path.exists(path):
            continue
        if kind == "text":
            if not rows:
                raise ValueError("the offline corpus ran out of text; lower --tokens or --gen-frac")
            shard = data.label_text_rows(target, rows, plan["k"], features=features)
        else:
            gi, n = kinds[:i].count("gen"), plan["gen_batch"]  # the gi-th generated shard
            shard = data.label_generations(target, tokenizer, prompts[gi * n:(gi + 1) * n], plan["k"],
                                           plan["gen_tokens"], temps[gi % len(temps)],
                                           seed=plan["seed"] * 100_003 + i)
            if features:
                data.add_features(target, shard)
        shard["wall_s"] = time.perf_counter() - ts
        data.save_shard(shard, path)
        done += 1
        progress.update("collect", done, len(todo), t0, f"shard {i} ({kind})", force=done == len(todo))
    used = {name: [n for n, _ in items[:cur]]
            for (name, items), cur in zip(text_rows.pools, text_rows.cursor)}
    pools = {name: {"items_available": len(items), "items_used": len(used[name]),
                    "chars_available": sum(len(t) for _, t in items)} for name, items in text_rows.pools}
    manifest = {"python": platform.python_version(), "corpus_pools": pools, "corpus_items_used": used,
                "prompts": prompts}
    write_json(os.path.join(data_dir, "manifest.json"), manifest, indent=1)
    return manifest


def run(target, tokenizer, out_dir, *, target_name, tokens=400_000, layers=None, layer_map=None,
        draft_vocab=16384, k=16, gen_frac=0.5, gen_tokens=128, gen_batch=32, row_len=256,
        shard_tokens=4096, gen_temperatures=(0.0, 0.7, 0.0, 1.0), epochs=3.0, steps=None, batch_rows=8,
        lr=1e-3, warmup=30, ckpt_every=50, eval_every=50, max_train_minutes=None, seed=0, amp=True,
        max_stdlib_files=None, command=None, progress_stream=None, export_dir=None, stop_after=None,
        arch="feature", feature_noise=0.1, feature_weight=0.1, ttt_depth=1, init_draft=None, prompt_mix="v1"):
    """The whole pipeline on a loaded target (an HF Llama causal LM); returns the export dir. ``arch``:
    "feature" (EAGLE-style, on the target's hidden state) or "lm" (a stand-alone small LM); ``ttt_depth``
    > 1 (feature drafts): training-time test that many chain tokens deep; ``init_draft``: fine-tune an
    exported draft (same architecture; its vocabulary, or, when ``draft_vocab`` is smaller, the
    ``draft_vocab`` of its tokens with the most teacher mass in the data); ``prompt_mix``: the categories the target answers
    (corpus.PROMPT_MIXES)."""
    mt = getattr(target.config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedTarget(f"specops distill builds Llama-architecture drafts that reuse the target's "
                                f"embedding and tokenizer; the target is a {mt!r} model. Supported: the "
                                f"embedded 'smollm2-135m' or a path to an HF model with model_type 'llama'.")
    if ttt_depth < 1 or (ttt_depth > 1 and arch != "feature"):
        raise ValueError(f"--ttt-depth must be 1, or > 1 with --arch feature; got {ttt_depth} with {arch!r}")
    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if prompt_mix not in corpus.PROMPT_MIXES:
        raise ValueError(f"--prompt-mix must be one of {', '.join(corpus.PROMPT_MIXES)}, got {prompt_mix!r}")
    progress = Progress(progress_stream)
    t_start = time.perf_counter()
    n_layers = target.config.num_hidden_layers
    layers = (1 if arch == "feature" else 2) if layers is None else layers
    if layer_map is None:  # the first layers - 1 and the last (the final norm and head know its features)
        if not 1 <= layers <= n_layers:
            raise ValueError(f"--layers must be in 1..{n_layers} (the target's layers), got {layers}")
        layer_map = list(range(layers - 1)) + [n_layers - 1]
    layer_map = list(layer_map)
    if len(layer_map) != layers or any(not 0 <= j < n_layers for j in layer_map):
        raise ValueError(f"--init-layers must name {layers} target layers in 0..{n_layers - 1}, got {layer_map}")
    shards_n = max(2, -(-tokens // shard_tokens))
    plan = {"target": target_name, "shards": shards_n, "shard_tokens": shard_tokens, "gen_frac": gen_frac,
            "gen_tokens": gen_tokens, "gen_batch": gen_batch, "row_len": row_len, "k": k, "seed": seed,
            "gen_temperatures": list(gen_temperatures), "max_stdlib_files": max_stdlib_files,
            **({"features": True} if arch == "feature" else {}),
            **({"prompt_mix": prompt_mix} if prompt_mix != "v1" else {})}  # v1: plans written before mixes
    data_dir = os.path.join(out_dir, "data")
    with torch.no_grad():
        manifest = collect(target.eval(), tokenizer, data_dir, plan, progress)
    collect_s = time.perf_counter() - t_start
    shards = data.load_shards(data_dir, shards_n)

    keep_path = os.path.join(data_dir, f"keep_{shards_n}_{draft_vocab}.pt")
    init = None
    always = (tokenizer.eos_token_id, tokenizer.bos_token_id)
    # Fine-tuning keeps the draft's vocabulary, whatever the data now ranks first, or cuts it to the
    # draft_vocab of its tokens the data ranks first.
    if init_draft is not None:
        from safetensors.torch import load_file

        path = os.path.join(init_draft, "model.safetensors")
        if not os.path.exists(path):
            raise ValueError(f"--init-draft: expected an exported draft directory with model.safetensors, "
                             f"got {init_draft}")
        init = load_file(path)
        keep = init.pop("lm_head.keep").to(torch.int64)
        if draft_vocab < keep.numel():
            keep = data.rank_vocab(shards, target.config.vocab_size, draft_vocab, always=always, within=keep)
    elif os.path.exists(keep_path):
        keep = torch.load(keep_path)
    else:
        keep = data.rank_vocab(shards, target.config.vocab_size, draft_vocab, always=always)
        torch.save(keep, keep_path)
    cov = data.coverage(shards, keep)
    progress.log(f"draft vocabulary: {keep.numel()} tokens cover {cov:.4f} of the target's top-1 labels")

    # Held out: the last shard of each kind (the generated one is the distribution that matters).
    kinds = [s["kind"] for s in shards]
    val_ids = {max(i for i, kd in enumerate(kinds) if kd == kind) for kind in set(kinds)} if len(shards) >= 4 else set()
    train_rows = flatten_rows([s for i, s in enumerate(shards) if i not in val_ids])
    val_rows = flatten_rows([s for i, s in enumerate(shards) if i in val_ids])
    per_epoch = max(1, len(train_rows) // batch_rows)
    total_steps = steps if steps is not None else max(1, int(round(epochs * per_epoch)))

    ckpt_dir = os.path.join(out_dir, "ckpt")
    sig = {"shards": shards_n, "draft_vocab": int(keep.numel()), "layers": layers, "layer_map": layer_map,
           "steps": total_steps, "batch_rows": batch_rows, "lr": lr, "seed": seed, "amp": amp, "arch": arch}
    if arch == "feature":
        sig.update(feature_noise=feature_noise, feature_weight=feature_weight, ttt_depth=ttt_depth,
                   init_draft=None if init_draft is None else os.path.abspath(init_draft))
    _settings(os.path.join(ckpt_dir, "settings.json"), sig, f"{ckpt_dir} holds checkpoints of a run with other "
              "settings ({diff}); remove it to start training afresh, or resume with the same settings")
    cfg = draft_config(target.config, layers)
    torch.manual_seed(seed)
    draft = build_draft(cfg, keep, target.model.embed_tokens.weight.detach().float(), arch=arch)
    if init is not None:
        missing, unexpected = draft.load_state_dict(init, strict=False)
        missing = sorted(set(missing) & {n for n, p in draft.named_parameters() if p.requires_grad})
        if unexpected or missing:
            raise ValueError(f"--init-draft {init_draft}: not this architecture (missing {missing[:4]}, "
                             f"unexpected {sorted(unexpected)[:4]})")
    else:
        (init_feature_draft if arch == "feature" else init_from_target)(draft, target, layer_map)
    draft.float()
    origin = f"fine-tuned from {init_draft}" if init_draft is not None else f"initialised from target layers {layer_map}"
    progress.log(f"draft: {layers} layers {origin}, "
                 f"{sum(p.numel() for p in draft.parameters() if p.requires_grad) / 1e6:.2f}M trainable params; "
                 f"{len(train_rows)} train rows, {len(val_rows)} held-out rows, {total_steps} steps")
    state = train(draft, train_rows, val_rows, ckpt_dir, steps=total_steps, batch_rows=batch_rows, lr=lr,
                  warmup=min(warmup, max(1, total_steps // 10)), seed=seed, amp=amp, ckpt_every=ckpt_every,
                  eval_every=eval_every, progress=progress, stop_after=stop_after,
                  max_seconds=None if max_train_minutes is None else 60.0 * max_train_minutes,
                  feature_noise=feature_noise, feature_weight=feature_weight, depth=ttt_depth)
    if stop_after and state["step"] < total_steps:
        return None
    best = torch.load(os.path.join(ckpt_dir, "best.pt"), weights_only=False)
    draft.load_state_dict(best["model"], strict=False)
    of_kind = {kind: [s for s in shards if s["kind"] == kind] for kind in dict.fromkeys(kinds)}
    by_kind = {kind: {"shards": len(ss), "rows": sum(s["tokens"].shape[0] for s in ss),
                      "labelled_tokens": sum(int(s["mask"].sum()) for s in ss),
                      "wall_s": round(sum(s.get("wall_s", 0.0) for s in ss), 1)}
               for kind, ss in of_kind.items()}
    record = {
        "target": target_name,
        "command": command,
        "architecture": {"layers": layers, "init_from_target_layers": layer_map, "hidden": cfg.hidden_size,
                         "intermediate": cfg.intermediate_size, "draft_vocab": int(keep.numel()),
                         "embedding_and_head": "the target's, frozen and tied (not stored here)"},
        "arch": arch,
        "objective": f"cross-entropy to the target's top-{k} next-token distribution renormalised over "
                     f"the draft vocabulary (forward KL up to a constant), teacher-forced"
                     + (f"; plus {feature_weight} x smooth-L1 between the predicted and the target's next "
                        f"final hidden state; inputs are the target's features with uniform noise "
                        f"+-{feature_noise} x their RMS (EAGLE)" if arch == "feature" else "")
                     + (f"; unrolled {ttt_depth} chain tokens deep, each deeper token reading the draft's own "
                        f"predicted feature (training-time test, EAGLE-3)" if ttt_depth > 1 else "")
                     + (f"; fine-tuned from {init_draft}" if init_draft is not None else ""),
        "data": {"shards": shards_n, "plan": plan, "top1_coverage_of_draft_vocab": cov, "by_kind": by_kind,
                 "prompt_categories": dict(collections.Counter(p["category"] for p in manifest["prompts"])),
                 **{key: manifest[key] for key in ("corpus_pools", "corpus_items_used")}},
        "training": {"steps_planned": total_steps, "steps_done": state["step"], "exported_step": state["best_step"],
                     "batch_rows": batch_rows, "lr": lr, "amp_bf16": amp, "seed": seed,
                     "train_wall_s": round(state["wall"], 1), "collect_wall_s_this_session": round(collect_s, 1),
                     "heldout_top1_agreement": state["best_agree"],
                     **({"heldout_top1_agreement_by_depth": state.get("best_agree_by_depth")} if ttt_depth > 1 else {}),
                     "history": state["history"]},
        "machine": {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "wall_s_this_invocation": round(time.perf_counter() - t_start, 1),
    }
    export_dir = export_dir or os.path.join(out_dir, "draft")
    save_draft(draft, export_dir, target=target_name, record=record)
    progress.log(f"exported the draft (step {state['best_step']}, held-out top-1 agreement "
                 f"{state['best_agree']:.3f}) to {export_dir}")
    return export_dir
