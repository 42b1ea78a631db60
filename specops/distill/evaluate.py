"""Quick check of a draft against its target: greedy top-1 agreement per prompt category and the
decode cost per token of draft vs target (noisy: the benchmark is bench/ on a quiet machine).

    python -m specops.distill.evaluate [--draft smollm2-135m-draft | --draft-dir DIR] [--new-tokens 64]

Agreement: the draft, teacher-forced on the target's greedy (bf16) answer to each held-out prompt,
must put its argmax on the target's next token at every generated position. A feature draft reads
the target's final hidden states; ``depth2`` scores its second token, from its own predicted feature."""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import DynamicCache

from .corpus import EVAL_CHAT, EVAL_PROMPTS, prompt_text
from .data import head_inputs
from .feature import is_feature_draft


@torch.no_grad()
def agreement(target, draft, tok, new_tokens=64, depth=1):
    """{category: (agreement, positions)} over the held-out prompts. ``depth`` 2: a feature draft's
    second chain token: from the target's feature at r and the token r+1 it predicts feature r+1
    itself, then token r+3 from (token r+2, that prediction)."""
    counts = {}
    for cat, text, chat in [(c, text, chat) for c, texts in EVAL_PROMPTS.items()
                            for text, chat in zip(texts, EVAL_CHAT[c])]:
        ids = torch.tensor([tok(prompt_text(tok, text, chat), add_special_tokens=False)["input_ids"]])
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              do_sample=False, temperature=None, top_p=None, top_k=None,
                              pad_token_id=tok.eos_token_id)
        P, want = ids.shape[1], seq[0, ids.shape[1]:]  # prompt length, the target's greedy answer
        if is_feature_draft(draft):
            with head_inputs(target) as feats:
                target(seq)
            # row r reads token r+1 and the target's feature r, and predicts token r+2
            logits = draft(seq[:, 1:], features=feats[-1][:, :-1]).logits[0]
            if depth == 2:
                g = draft.last_features  # [1, L-1, H]: row r estimates the target's feature r+1
                # row r of the second pass reads token r+2 and the estimate of feature r+1, predicts r+3
                logits = draft(seq[:, 2:], features=g[:, :-1]).logits[0]
            pred = logits[P - 1 - depth: -1].argmax(-1)
        else:
            pred = draft(seq).logits[0, P - 1: -1].argmax(-1)
        hit, tot = counts.get(cat, (0, 0))
        counts[cat] = (hit + int((pred == want).sum()), tot + want.numel())
    return {cat: (hit / max(1, tot), tot) for cat, (hit, tot) in counts.items()}


@torch.no_grad()
def step_cost(target, draft, prefix=128, steps=30):
    """Median ms of one decode step (one token after ``prefix`` cached ones), draft and target
    interleaved so both see the same machine load."""
    models, feature, H = {"target": target, "draft": draft}, is_feature_draft(draft), draft.config.hidden_size
    ids = torch.randint(100, 20000, (1, prefix))

    def extra(name, n):  # a feature draft reads n features (zeros)
        return {"features": torch.zeros(1, n, H)} if feature and name == "draft" else {}

    caches = {name: DynamicCache(config=m.config) for name, m in models.items()}
    for name, m in models.items():
        m(ids, past_key_values=caches[name], use_cache=True, **extra(name, prefix))
    tok, step, times = ids[:, -1:], {name: extra(name, 1) for name in models}, {name: [] for name in models}
    for _ in range(steps):
        for name, m in models.items():
            t = time.perf_counter()
            m(tok, past_key_values=caches[name], use_cache=True, **step[name])
            times[name].append(1e3 * (time.perf_counter() - t))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    from .. import models
    from . import load_draft, load_draft_dir, target_embedding

    p = argparse.ArgumentParser(prog="python -m specops.distill.evaluate", description=__doc__)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="smollm2-135m-draft")
    p.add_argument("--draft-dir", default=None, help="an exported draft directory instead of a shipped name")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tok = models.load(args.target, "bf16")
    draft = (load_draft_dir(args.draft_dir, target_embedding(args.target)[0], dtype=torch.bfloat16)
             if args.draft_dir else load_draft(args.draft, "bf16")[0])
    agree = agreement(target, draft, tok, args.new_tokens)
    cost = step_cost(target, draft)
    res = {"agreement": {k: round(v[0], 4) for k, v in agree.items()},
           **({"depth2_agreement": {k: round(v[0], 4) for k, v in agreement(
               target, draft, tok, args.new_tokens, depth=2).items()}} if is_feature_draft(draft) else {}),
           "positions": {k: v[1] for k, v in agree.items()},
           "agreement_all": round(sum(a * n for a, n in agree.values()) / max(1, sum(n for _, n in agree.values())), 4),
           "draft_ms": round(cost["draft"], 2), "target_ms": round(cost["target"], 2),
           "cost_ratio": round(cost["draft"] / cost["target"], 3), "threads": torch.get_num_threads(),
           "note": "timings on a shared machine are noisy"}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
