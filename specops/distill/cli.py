"""``specops distill --target smollm2-135m --out DIR [--tokens N --layers K ...]``."""
import argparse
import json
import os
import sys

import torch

from .pipeline import SUPPORTED_MODEL_TYPES, UnsupportedTarget, run

# Architectures of the embedded targets, known without loading them (so an unsupported one fails at once).
_EMBEDDED_TYPES = {"smollm2-135m": "llama", "gemma3-270m": "gemma3_text"}


def add_arguments(p):
    """The ``distill`` options, for ``specops distill`` and ``python -m specops.distill``."""
    p.add_argument("--target", required=True, help="embedded target name (smollm2-135m) or a path to an HF Llama model")
    p.add_argument("--out", required=True, help="work directory: data shards, checkpoints, exported draft (resumable)")
    p.add_argument("--tokens", type=int, default=400_000, help="labelled tokens to collect (default 400k)")
    p.add_argument("--arch", choices=("feature", "lm"), default="feature",
                   help="feature: EAGLE-style draft on the target's final hidden state (default); "
                        "lm: a stand-alone small LM on the target's embedding")
    p.add_argument("--layers", type=int, default=None, help="draft decoder layers (default 1 feature, 2 lm)")
    p.add_argument("--init-layers", default=None,
                   help="comma-separated target layers that initialise the draft's (default: first K-1 and last)")
    p.add_argument("--draft-vocab", type=int, default=16384,
                   help="tokens the draft scores (default 16384); with --init-draft, a smaller value keeps the "
                        "draft's tokens with the most teacher mass in the data")
    p.add_argument("--topk", type=int, default=16, help="teacher log-probs kept per position (default 16)")
    p.add_argument("--gen-frac", type=float, default=0.5, help="share of shards the target generates (default 0.5)")
    p.add_argument("--gen-tokens", type=int, default=128, help="new tokens per generated answer (default 128)")
    p.add_argument("--gen-batch", type=int, default=32, help="prompts per generated shard (default 32)")
    p.add_argument("--prompt-mix", choices=("v1", "v2"), default="v1",
                   help="the prompt categories the target answers: v1 code, prose, math, chat (the shipped "
                        "draft's); v2 adds translation, summarization, factual and passage questions")
    p.add_argument("--row-len", type=int, default=256, help="tokens per corpus row (default 256)")
    p.add_argument("--epochs", type=float, default=3.0, help="passes over the data (default 3)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    p.add_argument("--batch-rows", type=int, default=8, help="rows per optimizer step (default 8)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--max-train-minutes", type=float, default=None,
                   help="stop training after this many minutes (checkpointed; the best step is exported)")
    p.add_argument("--ttt-depth", type=int, default=1,
                   help="feature drafts: train this many chain tokens deep, deeper ones from the draft's own "
                        "predicted features (training-time test; default 1)")
    p.add_argument("--init-draft", default=None,
                   help="fine-tune from this exported draft directory instead of initialising from the target")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-amp", action="store_true", help="train in fp32 instead of bf16 autocast")
    p.add_argument("--export", default=None, help="where to write the draft (default OUT/draft)")
    return p


def load_target(spec):
    """(model, tokenizer, name) in bf16; raises UnsupportedTarget before loading anything it cannot use."""
    from .. import models

    if models.is_embedded_name(spec):
        base, kind = models.split_name(spec)
        if kind is not None:
            raise UnsupportedTarget(f"{spec!r} is a draft, not a target; distil against {base!r}")
        mt = _EMBEDDED_TYPES.get(base)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedTarget(f"cannot distil a draft for {spec!r}: it is a {mt!r} model and specops distill "
                                    f"supports Llama-architecture targets (smollm2-135m, or a path to an HF "
                                    f"Llama model)")
        return (*models.load(spec, "bf16"), spec)
    if os.path.isdir(spec) and os.path.exists(os.path.join(spec, "config.json")):
        with open(os.path.join(spec, "config.json")) as f:
            mt = json.load(f).get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedTarget(f"cannot distil a draft for {spec}: model_type {mt!r} is not supported "
                                    f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    elif not os.path.exists(spec):
        names = ", ".join(k for k, v in _EMBEDDED_TYPES.items() if v in SUPPORTED_MODEL_TYPES)
        raise UnsupportedTarget(f"unknown target {spec!r}: expected an embedded name ({names}) or a path to "
                                f"an HF Llama model directory")
    return (*models.load_path(spec, "bf16"), os.path.abspath(spec))


def run_args(args, command=None):
    """Runs ``specops distill`` on parsed ``args``; ``command`` is recorded with the draft
    (default: this process's command line). Returns the exit status."""
    if args.threads:
        torch.set_num_threads(args.threads)
    layer_map = [int(x) for x in args.init_layers.split(",")] if args.init_layers else None
    command = command or " ".join(["specops"] + sys.argv[1:])
    try:
        model, tok, name = load_target(args.target)
        out = run(model, tok, args.out, target_name=name, tokens=args.tokens, layers=args.layers,
                  layer_map=layer_map, draft_vocab=args.draft_vocab, k=args.topk, gen_frac=args.gen_frac,
                  gen_tokens=args.gen_tokens, gen_batch=args.gen_batch, row_len=args.row_len, epochs=args.epochs,
                  steps=args.steps, batch_rows=args.batch_rows, lr=args.lr, max_train_minutes=args.max_train_minutes,
                  seed=args.seed, amp=not args.no_amp, command=command, progress_stream=sys.stderr,
                  export_dir=args.export, arch=args.arch, ttt_depth=args.ttt_depth, init_draft=args.init_draft,
                  prompt_mix=args.prompt_mix)
    except (ValueError, ImportError) as err:  # UnsupportedTarget among them
        print(f"specops distill: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nspecops distill: interrupted; run the same command again to resume from {args.out}",
              file=sys.stderr)
        return 130
    print(out)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="specops distill", description=__doc__)
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_args(p.parse_args(argv), "specops distill " + " ".join(argv))
