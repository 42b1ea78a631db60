"""``bench_decoding.py --compare-engines``: specops against the engines a CPU user would pick
instead, on one question file, and against the machine's memory-bandwidth limit.

    python bench/bench_decoding.py --compare-engines --threads 2 \
        --engine-python vllm_cpu=/opt/peers/vllm/bin/python --engine-python llama_cpp=/opt/peers/llamacpp/bin/python

Every provider decodes the same prompts: the first turn of the first ``--per-category`` (default 1)
questions of each category of ``--questions`` (default bench/questions/specops_mix.jsonl) through
the target's chat template, as token ids; greedy, EOS ignored, ``--new-tokens`` (default 96) new
tokens, batch 1, ``--threads`` threads. Providers:

* ``specops_ar`` / ``specops_ngram``: ``specops.generate`` with the eager model forward;
* ``specops_ar_compiled`` / ``specops_ngram_compiled``: the same with compiled forwards
  (``generate(compile=True)``); the compilation happens in a warm-up before timing, and its time is
  reported apart: the first generate including compilation (``first_generate_s``) and the seconds
  per compiled graph (``compile_s``, per bucket);
* peers, each in its own venv and process (bench/engines/__init__.py): ``vllm_cpu/plain``,
  ``vllm_cpu/ngram``, ``llama_cpp/plain``, ``llama_cpp/prompt_lookup``;
* ``bandwidth_limit``: weight bytes / the machine's copy bandwidth (read + write, measured now), as
  tokens per second: the rate at which plain decoding would stream the bf16 weights once per token.

Output: one table (tok/s per category, the median, the ratio to ``specops_ar``) on stdout and
``bench/results/<machine>/engines.csv`` (this run's rows, plus earlier rows of providers it did
not run: ``--methods vllm_cpu/plain,...`` adds peers to a file; ``specops_ar`` always runs).
"""
import csv
import os
import statistics
import sys
import time

import torch

import specops
from specops import models
from specops.engine import compiled

import questions as qfile
from _harness import FIELDS, RESULTS, Recorder, machine_limits

from . import PEERS, interpreter, run

DEFAULT_QUESTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "questions",
                                 "specops_mix.jsonl")
TARGET = "smollm2-135m"
SPECOPS = (("specops_ar", "ar", False), ("specops_ngram", "ngram", False),
           ("specops_ar_compiled", "ar", True), ("specops_ngram_compiled", "ngram", True))


def _generate(target, ids, method, compile_, new):
    """One batch-1 generate; returns (tokens, seconds, metrics)."""
    t0 = time.perf_counter()
    out, m = specops.generate(target, [ids], method=method, max_new_tokens=new, eos_token_id=[], compile=compile_)
    dt = time.perf_counter() - t0
    return out.shape[1], dt, m


def run_specops(target, prompts, new, rec, base):
    """Every specops provider on every category. Compiled providers first compile in a timed
    warm-up (the first generate of the process); then the categories run with the providers
    interleaved, so a machine whose load drifts affects them alike."""
    first = next(iter(prompts.values()))[0]
    chosen = [p for p in SPECOPS if rec.wants(p[0]) or p[0] == "specops_ar"]  # AR always runs: the baseline
    for provider, method, compile_ in chosen:
        if compile_:
            before = dict(compiled.decoder_for(target).compile_s)
            n, secs, _ = _generate(target, first, method, True, new)
            rec.value(provider, base, "first_generate_s", "s", secs)
            for key, s in compiled.decoder_for(target).compile_s.items():
                if key not in before:
                    rec.value(provider, dict(base, bucket=key[0]), "compile_s", "s", s)
            print(f"# {provider}: first generate incl. compilation {secs:.1f} s", flush=True)
        else:
            _generate(target, first, method, False, 8)  # warm-up
    out = {p[0]: {} for p in chosen}
    for category, ids_list in prompts.items():
        for provider, method, compile_ in chosen:
            n = s = 0.0
            for ids in ids_list:
                k, dt, _ = _generate(target, ids, method, compile_, new)
                n, s = n + k, s + dt
            out[provider][category] = n / s
            print(f"# {provider} {category}: {n / s:.1f} tok/s", flush=True)
    return out


def run_peers(prompts, new, threads, given, rec, base):
    out = {}
    job = dict(model_dir=os.path.join(models.cache_dir(), TARGET), gguf=models.EMBEDDED[TARGET].locate(None),
               prompts=prompts, new_tokens=new, threads=threads)
    for peer, (_, _, variants) in PEERS.items():
        python, why = interpreter(peer, given.get(peer))
        for variant in variants:
            provider = f"{peer}/{variant}"
            if not rec.wants(provider):
                continue
            if python is None:
                rec.skip(provider, base, why)
                print(f"# skipped {provider}: {why}", flush=True)
                continue
            res = run(peer, python, dict(job, variant=variant))
            if "error" in res:
                rec.skip(provider, base, res["error"])
                print(f"# skipped {provider}: {res['error']}", flush=True)
                continue
            out[provider] = {c: r["tokens"] / r["seconds"] for c, r in res["results"].items()}
            rec.value(provider, dict(base, engine=res["engine"]), "startup_s", "s", res["startup_s"])
            print(f"# {provider} ({res['engine']}): " + ", ".join(f"{c} {v:.1f}" for c, v in out[provider].items())
                  + f" tok/s; start-up {res['startup_s']:.0f} s", flush=True)
    return out


def bandwidth_limit(target):
    """tok/s at which the weights stream once per token at the measured copy bandwidth."""
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    gbps = machine_limits("cpu")["memcpy_gbps"]
    return gbps * 1e9 / weight_bytes, weight_bytes, gbps


def table(rates, categories):
    """Plain-text table: provider rows, tok/s per category, median, x specops_ar (per-category ratios' median)."""
    ar = rates.get("specops_ar")
    head = f"{'provider':<26}" + "".join(f"{c[:8]:>9}" for c in categories) + f"{'median':>9}{'x AR':>7}"
    lines = [head]
    for name, per in rates.items():
        vals = [per.get(c) for c in categories]
        med = statistics.median(v for v in vals if v is not None)
        ratio = statistics.median(per[c] / ar[c] for c in categories if c in per and ar and c in ar) if ar else None
        lines.append(f"{name:<26}" + "".join(f"{v:9.1f}" if v is not None else f"{'-':>9}" for v in vals)
                     + f"{med:9.1f}" + (f"{ratio:7.2f}" if ratio is not None else f"{'-':>7}"))
    return "\n".join(lines)


def _write_merged(rec, out_dir, providers):
    """This run's rows plus the earlier rows of providers it did not run (a ``--methods`` subset adds
    to the file; every row keeps its own run's ratios)."""
    path = os.path.join(out_dir, "engines.csv")
    kept = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["provider"] not in providers]
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rec.rows + kept)
    return path


def main(args):
    """Entry from bench_decoding.main with its parsed ``args``."""
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    given = dict(kv.split("=", 1) for kv in (args.engine_python or []))
    unknown = set(given) - set(PEERS)
    if unknown:
        sys.exit(f"--engine-python: unknown peers {sorted(unknown)}; expected {sorted(PEERS)}")
    path = args.questions or DEFAULT_QUESTIONS
    qs = qfile.load(path, args.tasks.split(",") if args.tasks else None, args.per_category or 1)
    new = args.new_tokens or 96
    target, tok = models.load(TARGET, "bf16")
    prompts = qfile.encode(tok, qs)
    rec = Recorder("engines", "cpu", False, args.methods.split(",") if args.methods else None)
    base = dict(target=TARGET, dtype="bf16", mode="greedy", batch=1, new_tokens=new, threads=threads,
                questions=os.path.basename(path), prompts_per_category=len(next(iter(prompts.values()))))
    rates = run_specops(target, prompts, new, rec, base)
    rates.update(run_peers(prompts, new, threads, given, rec, base))
    limit, weight_bytes, gbps = bandwidth_limit(target)
    rates["bandwidth_limit"] = dict.fromkeys(prompts, limit)
    rec.value("bandwidth_limit", dict(base, weight_bytes=weight_bytes, memcpy_gbps=round(gbps, 2)),
              "tokens_per_s", "tok/s", limit)
    for provider, per in rates.items():
        for category, v in per.items():
            rec.value(provider, dict(base, task=category), "tokens_per_s", "tok/s", v)
            if "specops_ar" in rates:
                rec.value(provider, dict(base, task=category), "speedup_vs_ar", "x", v / rates["specops_ar"][category])
    out_dir = args.out or os.path.join(RESULTS, rec.info["machine"])
    csv_path = _write_merged(rec, out_dir, {r["provider"] for r in rec.rows})
    print(table(rates, list(prompts)))
    print(f"# bandwidth limit: {weight_bytes / 1e6:.0f} MB of weights at {gbps:.1f} GB/s copy bandwidth")
    print(f"# wrote {csv_path}")
    return rec
