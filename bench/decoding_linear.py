"""End-to-end effect of specops.linear in the engine: specops.generate on SmolLM2-135M bf16, greedy,
one question per category of bench/questions/specops_mix.jsonl, every method with linear="torch"
(F.linear everywhere) and "auto" (every call through specops.linear, the default; "specops" is the
same for a bf16 model), interleaved per question, with the batch-invariant mode off (its own
benchmark is bench/batch_invariant.py) so that only the linear choice differs. Time to first token
(the prefill) is reported apart from the per-token decode rate.

    python bench/decoding_linear.py [--methods ar,ngram,sd,tsd] [--new-tokens 96] [--reps 1]
"""
import argparse
import json
import os
import statistics

import torch

import specops
from specops import models

QUESTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "questions", "specops_mix.jsonl")
ARMS = ("torch", "auto")


def prompts(tok):
    first = {}
    with open(QUESTIONS) as f:
        for line in f:
            q = json.loads(line)
            first.setdefault(q["category"], q)
    return {c: tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False,
                                       add_generation_prompt=True) for c, q in first.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="ar,ngram,sd,tsd")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args(argv)
    model, tok = models.load("smollm2-135m", dtype=torch.bfloat16)
    qs = prompts(tok)
    specops.generate(model, next(iter(qs.values())), method="ar", max_new_tokens=8, tokenizer=tok)  # warm-up
    rows = {}
    for _ in range(args.reps):
        for cat, p in qs.items():
            for method in args.methods.split(","):
                for arm in ARMS:
                    _, m = specops.generate(model, p, method=method, max_new_tokens=args.new_tokens, tokenizer=tok,
                                            linear=arm, batch_invariant=False)
                    decode = (m.num_generated_tokens - 1) / max(1e-9, m.total_time_s - m.prefill_time_s)
                    rows.setdefault((method, arm), []).append((cat, decode, m.prefill_time_s))
    print(f"# SmolLM2-135M bf16 greedy, {args.new_tokens} tokens, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| method | linear | decode tok/s (median) | vs torch (median of per-question ratios) | TTFT s (median) |")
    print("|---|---|---|---|---|")
    for method in args.methods.split(","):
        base = rows[(method, "torch")]  # the same questions in the same order: paired ratios
        for arm in ARMS:
            r = rows[(method, arm)]
            ratio = statistics.median(d / b for (_, d, _), (_, b, _) in zip(r, base))
            print(f"| {method} | {arm} | {statistics.median(d for _, d, _ in r):.1f} | {ratio:.2f}x | "
                  f"{statistics.median(t for _, _, t in r):.3f} |")


if __name__ == "__main__":
    main()
