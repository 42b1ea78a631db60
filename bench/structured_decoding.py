"""Structured output with speculation (docs/structured.md): JSON-schema-constrained against
unconstrained decoding on SmolLM2-135M-Instruct bf16, greedy, prompts that ask for JSON. For AR and
every method: decode tok/s (time to first token apart), paired per prompt, whether each
constrained output parses and matches the schema's keys and types, and the grammar's host work: the
verified block's masks per node (``Grammar.fill_tree_bitmask``), the draft rows' masks per row
(``Grammar.rows_after``), host-candidate pruning (``Grammar.constrain``) and their share of the
decode time.

    python bench/structured_decoding.py [--methods ngram,sd,tsd] [--new-tokens 128] [--grammar-engine NAME]

Needs the converted SmolLM2 cache (specops.models) and a grammar engine (xgrammar or llguidance).
"""
import argparse
import json
import os
import statistics
import time
from contextlib import contextmanager

import torch

import specops
from specops import models
from specops.decoding import grammar as grammar_mod

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
        # bounded, so that a small model's repetition loops end inside the token budget
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 5},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "hobbies", "employed"],
    "additionalProperties": False,
}
TYPES = {"string": str, "integer": int, "array": list, "boolean": bool}
ASKS = [
    "Invent a person and describe them as a JSON object with name, age, city, hobbies and employed.",
    "Give me a JSON record for a fictional software engineer: name, age, city, hobbies, employed.",
    "Write a JSON object about a retired teacher who loves gardening (name, age, city, hobbies, employed).",
    "Describe a student from Paris in JSON with the fields name, age, city, hobbies and employed.",
]


def decode_rate(m):
    return (m.num_generated_tokens - 1) / max(1e-9, m.total_time_s - m.prefill_time_s)


def valid(text):
    """Parses and has exactly the schema's keys with its types (the subset of JSON Schema used)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    props = SCHEMA["properties"]
    return (isinstance(obj, dict) and set(obj) == set(props)
            and all(isinstance(obj[k], TYPES[p["type"]]) and not (p["type"] == "integer" and isinstance(obj[k], bool))
                    for k, p in props.items()))


@contextmanager
def timed_grammar(acc):
    """Times Grammar's per-step host work into ``acc``: name -> [seconds, units] (units: the mask
    rows each call fills: the block's valid nodes, the draft rows, the candidate nodes)."""
    G = grammar_mod.Grammar
    units = {
        "fill_tree_bitmask": lambda a, kw: (int(a[2].sum()) if len(a) > 2 and a[2] is not None
                                            else a[0].numel()),
        "rows_after": lambda a, kw: len(a[0]),
        "constrain": lambda a, kw: len(a[1]),
    }
    real = {name: getattr(G, name) for name in units}

    def wrap(name):
        def timed(self, *a, **kw):
            t0 = time.perf_counter()
            out = real[name](self, *a, **kw)
            cell = acc.setdefault(name, [0.0, 0])
            cell[0] += time.perf_counter() - t0
            cell[1] += units[name](a, kw)
            return out
        return timed

    for name in units:
        setattr(G, name, wrap(name))
    try:
        yield acc
    finally:
        for name, fn in real.items():
            setattr(G, name, fn)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="ngram,sd,tsd")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--grammar-engine", default=None)
    args = ap.parse_args(argv)
    model, tok = models.load("smollm2-135m", dtype=torch.bfloat16)
    prompts = [tok.apply_chat_template([{"role": "user", "content": a}], tokenize=False, add_generation_prompt=True)
               for a in ASKS]

    def gen(p, method, constrained):
        kw = dict(json_schema=SCHEMA, grammar_engine=args.grammar_engine) if constrained else {}
        return specops.generate(model, p, method=method, max_new_tokens=args.new_tokens, tokenizer=tok, **kw)

    gen(prompts[0], "ar", True)  # warm-up: grammar compile, first forwards
    methods = ["ar"] + args.methods.split(",")
    rate, ok = {}, {}  # (method, constrained) -> [tok/s per prompt]; method -> [valid per prompt]
    work, decode_s = {}, {}  # method -> {call: [s, units]}; method -> constrained decode seconds
    for p in prompts:
        for method in methods:  # interleaved per prompt: every arm sees the same machine state
            for constrained in (False, True):
                with timed_grammar(work.setdefault(method, {}) if constrained else {}):
                    out, m = gen(p, method, constrained)
                rate.setdefault((method, constrained), []).append(decode_rate(m))
                if constrained:
                    decode_s[method] = decode_s.get(method, 0.0) + m.total_time_s - m.prefill_time_s
                if constrained:
                    text = tok.decode(out.flatten().tolist(), skip_special_tokens=True)
                    ok.setdefault(method, []).append(valid(text))
    print(f"# SmolLM2-135M bf16 greedy, {args.new_tokens} tokens max, {len(prompts)} JSON prompts, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print("\n| method | free tok/s | JSON tok/s | JSON / free | JSON vs JSON AR | valid JSON |")
    print("|---|---|---|---|---|---|")
    ar = rate[("ar", True)]
    for method in methods:
        free, js = rate[(method, False)], rate[(method, True)]
        print(f"| {method} | {statistics.median(free):.1f} | {statistics.median(js):.1f} | "
              f"{statistics.median(j / f for j, f in zip(js, free)):.2f}x | "
              f"{statistics.median(j / a for j, a in zip(js, ar)):.2f}x | {sum(ok[method])}/{len(ok[method])} |")
    print("\n(ratios: medians of per-prompt ratios)")
    print("\n| method | block masks, us per node | draft masks, us per row | pruning, us per candidate | "
          "grammar share of decode |")
    print("|---|---|---|---|---|")
    for method in methods:
        w = work.get(method, {})

        def per(name):
            s, n = w.get(name, (0.0, 0))
            return f"{1e6 * s / n:.1f} ({n})" if n else "-"
        share = sum(s for s, _ in w.values()) / max(decode_s.get(method, 0.0), 1e-9)
        print(f"| {method} | {per('fill_tree_bitmask')} | {per('rows_after')} | {per('constrain')} | {share:.1%} |")
    print("\n(in parentheses: nodes / rows / candidates over all prompts)")


if __name__ == "__main__":
    main()
