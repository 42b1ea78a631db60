"""The ``specops`` command line: ``info`` (backends), ``generate`` (one method, streamed) and
``demo`` (every method on built-in prompts, compared in a table)."""
import argparse
import json
import os
import sys
import time

DEMO_PROMPTS = {
    "code": ("Rewrite this function with type hints and a docstring, keeping the logic:\n\n"
             "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
             "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n"
             "        else:\n            out.append(b[j])\n            j += 1\n"
             "    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n"),
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "math": "A train travels 120 km in 1.5 hours, then 80 km in 1 hour. What is its average speed? "
            "Explain step by step.",
}


def _text_or_file(value):
    """A grammar given inline or as the path of a file holding it (None stays None)."""
    if value is not None and os.path.isfile(value):
        with open(value) as f:
            return f.read()
    return value


def _param(text):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"method parameters look like name=value, got {text!r}")
    key, value = text.split("=", 1)
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False, "none": None}.get(value.lower(), value)


def _add_common(p):
    p.add_argument("--target", default="smollm2-135m", help="embedded name or model path (default: smollm2-135m)")
    p.add_argument("--draft", default=None,
                   help="embedded draft name (e.g. smollm2-135m-int8) or path; default: the best embedded draft")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="target dtype (default bf16)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--raw", action="store_true", help="no chat template (default: use the tokenizer's, if any)")
    p.add_argument("--no-adaptive", action="store_true",
                   help="fixed draft budgets (default: adaptive speculation sizes each block from the acceptance "
                        "and step costs seen, down to AR steps; also --param adaptive=false)")


def _check_flags(args):
    """The numeric flags and the output path, before any model loads (a bad one would otherwise
    fail after the load, or lose the whole run at the end). Raises ValueError naming the flag."""
    for flag, value, lo in (("--threads", args.threads, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                            ("--top-k", args.top_k, 0), ("--batch", getattr(args, "batch", None), 1)):
        if value is not None and value < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {value}")
    if args.json:
        check_writable("--json", args.json)


def check_writable(flag, path):
    """``path`` can be opened for writing: the file is created and removed again if it was not there."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {path!r} cannot be written: {err.strerror or err}") from None
    if not existed:
        os.remove(path)


def _setup(args):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from . import models
    from .parallel import env_world_size

    tp = getattr(args, "tp", None) or env_world_size()
    sharded = f", sharded over {tp} ranks" if tp > 1 else ""
    print(f"loading {args.target} ({args.dtype}{sharded}) ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    target, tok = models.load_any(args.target, args.dtype, tp)
    target.specops_name = args.target  # what an embedded load sets too: the default draft follows it
    print(f"loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return target, tok


def _encode(tok, text, raw):
    if not raw and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tok(text)["input_ids"]


_DRAFTS = {}


def _draft_for(args, method, target, params=None):
    """The draft model for ``method`` (None for model-free methods), loaded once per spec."""
    from . import models
    from .decoding import methods

    if not methods.make(method, **(params or {})).needs_draft_model:
        return None
    spec = args.draft
    if spec is None:
        if not models.is_embedded_name(args.target):
            raise ValueError(f"method {method} needs --draft (the target is not an embedded model)")
        spec = models.default_draft(args.target, next(target.parameters()).dtype)
    if spec not in _DRAFTS:
        print(f"loading draft {spec} ...", file=sys.stderr, flush=True)
        _DRAFTS[spec] = models.load_any(spec)[0]
    return _DRAFTS[spec]


def cmd_generate(args):
    from .decoding import generate, methods, SamplingConfig
    from .decoding.api import runner_keywords
    from .parallel import env_world_size

    _check_flags(args)
    params = dict(args.param or [])
    adaptive = _adaptive_flag(args, params)
    methods.make(args.method, **params)  # bad parameters fail before any model loads
    SamplingConfig(args.temperature, args.top_k, args.top_p)
    if args.tp is not None and args.tp != env_world_size():
        raise ValueError(f"--tp {args.tp} needs as many ranks: run it under torchrun --nproc-per-node {args.tp} "
                         f"(this run has WORLD_SIZE={env_world_size()})")
    runner_keywords(args.kv_layout, args.page_size, args.compile, args.compile_mode)  # before any model loads
    target, tok = _setup(args)
    draft = _draft_for(args, args.method, target, params)
    prompts = [_encode(tok, args.prompt, args.raw)] * args.batch
    shown, counts = [], [0] * args.batch
    start = time.perf_counter()
    progress = args.batch > 1 and sys.stderr.isatty()

    def stream(b, ids):
        counts[b] += len(ids)
        if progress:  # the text of sequence 0 streams; the others show up as a counter
            rate = sum(counts) / max(time.perf_counter() - start, 1e-9)
            sys.stderr.write(f"\r[{min(counts)}-{max(counts)}/{args.max_new_tokens} tokens x {args.batch}, "
                             f"{rate:.1f} tok/s] ")
            sys.stderr.flush()
        if b != 0:
            return
        before = tok.decode(shown)
        shown.extend(ids)
        sys.stdout.write(tok.decode(shown)[len(before):])
        sys.stdout.flush()

    out, m = generate(target, prompts, draft=draft, method=args.method, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, stop=args.stop,
                      tokenizer=tok, seed=args.seed, compare_ar=args.compare_ar, stream=stream,
                      kv_layout=args.kv_layout, page_size=args.page_size, tp_size=args.tp, compile=args.compile,
                      compile_mode=args.compile_mode, adaptive=adaptive,
                      batch_invariant="auto" if args.batch_invariant is None else args.batch_invariant,
                      json_schema=_text_or_file(args.json_schema), regex=args.regex, ebnf=_text_or_file(args.ebnf),
                      grammar_engine=args.grammar_engine, **params)
    print()
    for b in range(1, args.batch):
        print(f"--- sequence {b}:\n{tok.decode(out[b, : m.lengths[b]])}")
    print("---", m.summary(), sep="\n", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(m.as_dict(), f, indent=1)
    return 0


def _adaptive_flag(args, params):
    """``--no-adaptive`` or ``--param adaptive=false`` (removed from the method's parameters)."""
    adaptive = params.pop("adaptive", not args.no_adaptive)
    if not isinstance(adaptive, bool):
        raise ValueError(f"--param adaptive takes true or false, got {adaptive!r}")
    return adaptive and not args.no_adaptive


# The demo's per-method sums: key -> the Metrics attribute summed over the prompts.
_TOTALS = {"tokens": "num_generated_tokens", "time": "total_time_s", "drafts": "num_drafts",
           "accepted": "num_accepted_tokens", "drafted": "num_draft_tokens", "nodes": "num_drafted_nodes"}


def cmd_demo(args):
    from .decoding import DESCRIPTIONS, SamplingConfig, generate
    from .decoding import methods as registry

    _check_flags(args)
    methods = args.methods.split(",") if args.methods else list(registry.METHODS)
    for method in methods:
        registry.get(method)  # unknown names fail before any model loads
    SamplingConfig(args.temperature, args.top_k, args.top_p)
    target, tok = _setup(args)
    prompts = {kind: _encode(tok, text, args.raw) for kind, text in DEMO_PROMPTS.items()}
    print("warming up ...", file=sys.stderr, flush=True)
    generate(target, [prompts["math"]], method="ar", max_new_tokens=4, tokenizer=tok)
    rows, records = [], []
    for method in methods:
        draft = _draft_for(args, method, target)
        total, speedups = dict.fromkeys(_TOTALS, 0), {}
        for kind in DEMO_PROMPTS:
            _, m = generate(target, [prompts[kind]], draft=draft, method=method,
                            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, tokenizer=tok, seed=args.seed, adaptive=not args.no_adaptive)
            for key, attr in _TOTALS.items():
                total[key] += getattr(m, attr)
            speedups[kind] = m.tokens_per_s
            records.append(dict(m.as_dict(), prompt=kind, target=args.target, dtype=args.dtype))
            print(f"  {method:<10} {kind:<6} {m.tokens_per_s:6.1f} tok/s  MAL {m.mean_acceptance_length:.2f}",
                  file=sys.stderr, flush=True)
        rows.append((method, total, speedups))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    ar = next((r for r in rows if r[0] == "ar"), None)
    print(f"\ntarget {args.target} ({args.dtype}), {args.max_new_tokens} new tokens per prompt, temperature "
          f"{args.temperature}; timings are noisy on a shared machine")
    head = (f"{'method':<10} {'tok/s':>6} {'MAL':>5} {'speedup':>7} {'drafted/step':>12} {'nodes/step':>10} "
            f"{'accept':>6}  " + "  ".join(f"{k + ' x':>8}" for k in DEMO_PROMPTS))
    print(head, "-" * len(head), sep="\n")
    for method, t, per in rows:
        tps, acc, dps, nps = (t[a] / t[b] if t[b] else 0.0 for a, b in (("tokens", "time"), ("accepted", "drafted"),
                                                                          ("drafted", "drafts"), ("nodes", "drafts")))
        mal = 1 + t["accepted"] / t["drafts"] if t["drafts"] else 1.0
        sp = f"{tps / (ar[1]['tokens'] / ar[1]['time']):6.2f}x" if ar else "   n/a"  # speedups over AR
        each = "  ".join(f"{per[k] / ar[2][k]:7.2f}x" if ar else f"{'n/a':>8}" for k in DEMO_PROMPTS)
        print(f"{method:<10} {tps:6.1f} {mal:5.2f} {sp:>7} {dps:12.1f} {nps:10.1f} {acc:6.2f}  {each}")
    print("drafted/step: tokens sent to verification per step (vLLM); nodes/step: nodes the drafter built "
          "(root included; GSD's graph nodes)")
    for method in methods:
        print(f"  {method:<10} {DESCRIPTIONS[method]}")
    return 0


def cmd_bench(argv):
    """``specops bench ...`` = ``python -m bench ...`` in the source checkout this package runs from."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, "bench", "__main__.py")):
        print("specops: error: the benchmarks live in the source checkout (bench/); install with "
              "`pip install --no-build-isolation -e .` or run `python -m bench` there", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "bench", *argv], cwd=root)


def main(argv=None):
    from .decoding.methods import METHODS  # the CLI's method choices are the registry's names

    parser = argparse.ArgumentParser(prog="specops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backends available here and why (same as python -m specops)")

    gen = sub.add_parser("generate", help="generate with one method, streaming the text, then print metrics")
    _add_common(gen)
    defaults = (f"{name} ({', '.join(f'{k}={v}' for k, v in cls.PARAMS.items())})" if cls.PARAMS else name
                for name, cls in METHODS.items())
    gen.add_argument("--method", default="ngram", choices=list(METHODS),
                     help="method, with its --param defaults: " + "; ".join(defaults))
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--batch", type=int, default=1, help="run the prompt as a batch of this many sequences")
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--param", action="append", type=_param, metavar="NAME=VALUE",
                     help="method parameter, e.g. --param gamma=6 (repeatable)")
    gen.add_argument("--compare-ar", action="store_true", help="also time autoregressive decoding (speedup)")
    gen.add_argument("--json", default=None, help="write the metrics as JSON to this file")
    gen.add_argument("--kv-layout", default="contiguous", choices=("contiguous", "paged"),
                     help="KV cache layout of target and draft (default contiguous)")
    gen.add_argument("--page-size", type=int, default=16, help="rows per KV page with --kv-layout paged (power of two)")
    gen.add_argument("--compile", action="store_true",
                     help="compiled target and draft forwards (torch.compile, one graph for blocks of 1-64 rows; docs/compile.md)")
    gen.add_argument("--compile-mode", default="default",
                     help="torch.compile mode with --compile (default; reduce-overhead: CUDA graphs on a GPU)")
    gen.add_argument("--json-schema", default=None, metavar="SCHEMA",
                     help="structured output: a JSON schema (inline JSON or a file path) every token obeys "
                          "(pip install specops[grammar]; docs/structured.md)")
    gen.add_argument("--regex", default=None, help="structured output: a regex the whole output matches")
    gen.add_argument("--ebnf", default=None, metavar="GRAMMAR",
                     help="structured output: a GBNF grammar, start rule root (inline or a file path)")
    gen.add_argument("--grammar-engine", default=None, choices=("xgrammar", "llguidance"),
                     help="grammar engine for --json-schema/--regex/--ebnf (default: the first installed)")
    gen.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                     help="batch-invariant target ops: lossless methods emit AR's greedy tokens bit for bit in bf16 "
                          "(default: on for a bf16/fp16 CPU target, where it costs nothing; docs/batch_invariance.md)")
    gen.add_argument("--tp", type=int, default=None,
                     help="tensor parallelism over N ranks: run under torchrun --nproc-per-node N (default: the "
                          "torchrun world size); rank 0 prints (docs/scaling.md)")

    demo = sub.add_parser("demo", help="compare every method on built-in prompts (code, prose, math)")
    _add_common(demo)
    demo.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    demo.add_argument("--json", default=None, help="write every run's metrics (method x prompt) as JSON")

    # Listed here; their own parsers (specops.distill.cli, python -m bench) read their flags, below.
    sub.add_parser("distill", help="distil a small draft model for an embedded target (CPU, resumable)")
    sub.add_parser("bench", help="run the benchmark suite (python -m bench; needs a source checkout)")

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the suite's own parser reads the rest, --help included
        return cmd_bench(argv[1:])
    if argv[:1] == ["distill"]:  # training code loads for its own command only
        from .distill.cli import main as distill_main

        return distill_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "info":
        from .backend_report import report

        print(report())
        return 0
    # Under torchrun only rank 0 prints (text, metrics, progress); errors print on every rank, tagged.
    errors, rank = sys.stderr, os.environ.get("RANK")
    under_torchrun = rank is not None and os.environ.get("WORLD_SIZE", "1") != "1"
    if under_torchrun and rank != "0":
        sys.stdout = sys.stderr = open(os.devnull, "w")
    rank = f" (rank {rank})" if under_torchrun else ""
    try:
        if args.command == "generate":
            return cmd_generate(args)
        return cmd_demo(args)
    except (ValueError, ImportError) as err:
        print(f"specops: error{rank}: {err}", file=errors)
        return 2
    except Exception:
        # Under torchrun a failing rank says so even where silenced (torchrun stops the others, exits != 0).
        import traceback

        print(f"specops: error{rank}:\n{traceback.format_exc()}", file=errors)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
