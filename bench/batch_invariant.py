"""Exact speculation in bf16: specops.generate(batch_invariant=True) on SmolLM2-135M bf16, greedy, one
question per category of bench/questions/specops_mix.jsonl.

For every category, AR with the mode is the reference text. Every lossless method runs with the mode
(contiguous and paged caches, optionally compiled, then against compiled AR) and its tokens are
compared with the reference;
the same methods run on the fast path (batch_invariant=False) and are compared with the fast path's
AR, which shows the drift the mode removes. The first three questions also decode as one batch of 3
and are compared with each decoded alone. Decode rates (time to first token apart) of the mode and
the fast path come from the same run, paired per question.

    python bench/batch_invariant.py [--methods ngram,sd,tsd,specinfer,opt-tree,ouroboros]
                                    [--new-tokens 96] [--layouts contiguous,paged] [--compiled]
                                    [--compiled-only] [--categories N]
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specops  # noqa: E402
from decoding_linear import prompts  # noqa: E402
from specops import models  # noqa: E402


def decode_rate(m):
    return (m.num_generated_tokens - 1) / max(1e-9, m.total_time_s - m.prefill_time_s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="ngram,sd,tsd,specinfer,opt-tree,ouroboros")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--layouts", default="contiguous,paged")
    ap.add_argument("--compiled", action="store_true", help="also run every arm compiled (slow: compiles)")
    ap.add_argument("--compiled-only", action="store_true",
                    help="only the compiled arms' identity (compiled AR the reference; no timings)")
    ap.add_argument("--categories", type=int, default=None, help="the first N categories only")
    args = ap.parse_args(argv)
    model, tok = models.load("smollm2-135m", dtype=torch.bfloat16)
    qs = dict(list(prompts(tok).items())[: args.categories])
    gen = lambda p, method, **kw: specops.generate(model, p, method=method, max_new_tokens=args.new_tokens,
                                                   tokenizer=tok, eos_token_id=[], **kw)
    if args.compiled_only:
        return compiled_only(args, qs, gen)
    gen(next(iter(qs.values())), "ar")  # warm-up
    methods = args.methods.split(",")
    layouts = args.layouts.split(",")
    compiles = [False, True] if args.compiled else [False]
    same = {}  # (method, arm) -> [equal per category]
    rate = {}  # (method, mode) -> [(category, decode tok/s, TTFT)]
    for cat, p in qs.items():
        ref, m = gen(p, "ar", batch_invariant=True)
        rate.setdefault(("ar", "invariant"), []).append((cat, decode_rate(m), m.prefill_time_s))
        # Compiled forwards are their own reference: inductor fuses the norms and elementwise ops
        # with other roundings than eager torch, so compiled AR's text may differ from eager AR's.
        refs = {False: ref, True: gen(p, "ar", batch_invariant=True, compile=True)[0] if args.compiled else None}
        fast_ar, m = gen(p, "ar", batch_invariant=False)
        rate.setdefault(("ar", "fast"), []).append((cat, decode_rate(m), m.prefill_time_s))
        for method in ["ar"] + methods:
            for compiled in compiles:
                for layout in layouts:
                    if method == "ar" and layout == "contiguous":
                        continue
                    out, m = gen(p, method, batch_invariant=True, kv_layout=layout, compile=compiled)
                    same.setdefault((method, f"{layout}{' compiled' if compiled else ''}"), []).append(
                        out.tolist() == refs[compiled].tolist())
                    if layout == "contiguous" and not compiled:
                        rate.setdefault((method, "invariant"), []).append((cat, decode_rate(m), m.prefill_time_s))
            if method != "ar":
                out, m = gen(p, method, batch_invariant=False)
                same.setdefault((method, "fast path vs its AR"), []).append(out.tolist() == fast_ar.tolist())
                rate.setdefault((method, "fast"), []).append((cat, decode_rate(m), m.prefill_time_s))
        print(f"{cat}: done", file=sys.stderr, flush=True)
    first3 = list(qs.values())[:3]
    batch, _ = specops.generate(model, first3, method="ar", max_new_tokens=args.new_tokens, tokenizer=tok,
                                eos_token_id=[], batch_invariant=True)
    alone = [gen(p, "ar", batch_invariant=True)[0][0].tolist() for p in first3]
    batch_ok = all(batch[b].tolist() == alone[b] for b in range(3))

    print(f"# SmolLM2-135M bf16 greedy, {args.new_tokens} tokens, {len(qs)} categories, {torch.get_num_threads()} "
          f"threads, load average {os.getloadavg()[0]:.2f}")
    print("\n| method | arm | token-identical to AR (categories) |\n|---|---|---|")
    for (method, arm), ok in same.items():
        print(f"| {method} | {arm} | {sum(ok)}/{len(ok)} |")
    print(f"\nbatch of 3 (AR, invariant) equals each sequence alone: {batch_ok}")
    print("\n| method | fast tok/s | invariant tok/s | invariant / fast (median of per-question ratios) | "
          "vs fast AR | TTFT fast -> invariant s |\n|---|---|---|---|---|---|")
    for method in ["ar"] + methods:
        f, i, a = rate[(method, "fast")], rate[(method, "invariant")], rate[("ar", "fast")]
        ratio = statistics.median(x / y for (_, x, _), (_, y, _) in zip(i, f))
        vs_ar = statistics.median(x / y for (_, x, _), (_, y, _) in zip(i, a))
        print(f"| {method} | {statistics.median(x for _, x, _ in f):.1f} | {statistics.median(x for _, x, _ in i):.1f}"
              f" | {ratio:.2f}x | {vs_ar:.2f}x | {statistics.median(t for *_, t in f):.3f} -> "
              f"{statistics.median(t for *_, t in i):.3f} |")


def compiled_only(args, qs, gen):
    """Compiled AR with the mode is the reference; every method compiled with the mode on every
    layout is compared with it, and compiled AR with eager AR."""
    same = {}
    for cat, p in qs.items():
        ref = gen(p, "ar", batch_invariant=True, compile=True)[0]
        eager = gen(p, "ar", batch_invariant=True)[0]
        same.setdefault(("ar", "compiled vs eager"), []).append(ref.tolist() == eager.tolist())
        for method in ["ar"] + args.methods.split(","):
            for layout in args.layouts.split(","):
                if method == "ar" and layout == "contiguous":
                    continue
                out = gen(p, method, batch_invariant=True, kv_layout=layout, compile=True)[0]
                same.setdefault((method, f"{layout} compiled"), []).append(out.tolist() == ref.tolist())
        # each category's outcome at once: a run cut short still says what it measured
        outcome = ", ".join(f"{m} {arm.split()[0]} {'=' if ok[-1] else 'DIFFERS'}" for (m, arm), ok in same.items())
        print(f"{cat}: done ({outcome})", file=sys.stderr, flush=True)
    print(f"# SmolLM2-135M bf16 greedy, {args.new_tokens} tokens, {len(qs)} categories, compiled, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print("\n| method | arm | token-identical to compiled AR (categories) |\n|---|---|---|")
    for (method, arm), ok in same.items():
        print(f"| {method} | {arm} | {sum(ok)}/{len(ok)} |")


if __name__ == "__main__":
    main()
