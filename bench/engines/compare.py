"""``bench_decoding.py --compare-engines``: specops against the engines a CPU user would pick
instead, on one question file, and against the machine's memory-bandwidth limit.

    python bench/bench_decoding.py --compare-engines --threads 2 \
        --engine-python vllm_cpu=/opt/peers/vllm/bin/python --engine-python llama_cpp=/opt/peers/llamacpp/bin/python

Every provider decodes the same prompts: the first turn of the first ``--per-category`` (default 1)
questions of each category of ``--questions`` (default bench/questions/specops_mix.jsonl) through
the target's chat template, as token ids; greedy, EOS ignored, ``--new-tokens`` (default 96) new
tokens, batch 1, ``--threads`` threads. Every provider is started and warmed up first; then each
prompt goes through every provider in turn (interleaved per prompt), each time twice: one token
(time to first token) and ``--new-tokens`` tokens; the per-token decode rate is the difference over
the remaining tokens, so prefill and start-up are reported apart from it. Providers:

* ``specops_ar`` / ``specops_ngram``: ``specops.generate`` with the eager model forward;
* ``specops_ar_compiled`` / ``specops_ngram_compiled``: the same with compiled forwards
  (``generate(compile=True)``); the compilation happens in a warm-up before timing, and its time is
  reported apart: the first generate including compilation (``first_generate_s``) and the seconds
  per compiled graph (``compile_s``);
* peers, each in its own venv and a process that lives for the whole run (bench/engines/__init__.py):
  ``vllm_cpu/plain``, ``vllm_cpu/ngram``, ``llama_cpp/plain`` and ``llama_cpp/prompt_lookup`` (the
  bf16 GGUF converted from the same checkpoint by llama.cpp's converter, ``--llama-convert``),
  ``llama_cpp/plain_q4_1`` (the Q4_1 GGUF the embedded model ships: a quarter of the weight bytes);
* ``bandwidth_limit``: weight bytes / the machine's copy bandwidth (read + write, measured now), as
  tokens per second: the rate at which plain decoding would stream the bf16 weights once per token.

Output: one table (decode tok/s per category, the median, the ratio to ``specops_ar``, the median
time to first token) on stdout and ``bench/results/<machine>/engines.csv`` (this run's rows, plus
earlier rows of providers it did not run: ``--methods vllm_cpu/plain,...`` adds peers to a file;
``specops_ar`` always runs).
"""
import contextlib
import csv
import os
import statistics
import subprocess
import sys
import time

import questions as qfile
import torch
from _harness import FIELDS, RESULTS, Recorder, machine_limits

import specops
from specops import models
from specops.engine import compiled

from . import PEERS, Peer, PeerError, interpreter

DEFAULT_QUESTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "questions",
                                 "specops_mix.jsonl")
TARGET = "smollm2-135m"
SPECOPS = (("specops_ar", "ar", False), ("specops_ngram", "ngram", False),
           ("specops_ar_compiled", "ar", True), ("specops_ngram_compiled", "ngram", True))


def bf16_gguf(converter, python):
    """The bf16 GGUF of the same checkpoint the other providers load, converted once with
    llama.cpp's own converter (``convert_hf_to_gguf.py --outtype bf16``, run with the llama.cpp
    peer's interpreter ``python``, which holds the converter's requirements, and the ``gguf-py``
    package beside it) and kept in the specops cache. Returns (path or None, why not)."""
    model_dir = os.path.join(models.cache_dir(), TARGET)
    path = os.path.join(model_dir, "model-bf16.gguf")
    if os.path.exists(path):
        return path, None
    converter = converter or os.environ.get("SPECOPS_LLAMA_CONVERT")
    if python is None:
        return None, "no llama.cpp peer interpreter to run the converter with"
    if not converter or not os.path.exists(converter):
        return None, ("no bf16 GGUF: pass --llama-convert /path/to/llama.cpp/convert_hf_to_gguf.py "
                      "or set SPECOPS_LLAMA_CONVERT")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(converter), "gguf-py"))
    proc = subprocess.run([python, converter, model_dir, "--outtype", "bf16", "--outfile", path + ".tmp"],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None, f"convert_hf_to_gguf failed: {' | '.join(proc.stderr.strip().splitlines()[-2:])[:300]}"
    os.replace(path + ".tmp", path)
    return path, None


class Specops:
    """A specops provider in this process, with the peers' ``generate`` signature."""

    def __init__(self, target, method, compile_):
        self.target, self.method, self.compile = target, method, compile_
        self.warm = False  # compiled: after the warm-up, a new graph is an error (it would be timed)

    def generate(self, ids, new):
        frozen = compiled.decoder_for(self.target).frozen() if self.compile and self.warm else contextlib.nullcontext()
        with frozen:
            t0 = time.perf_counter()
            out, _ = specops.generate(self.target, [ids], method=self.method, max_new_tokens=new, eos_token_id=[],
                                      compile=self.compile)
            return out.shape[1], time.perf_counter() - t0


def start_specops(target, first, new, rec, base):
    """The specops providers, warmed up. A compiled provider compiles in its warm-up (the first
    generate of the process), timed and reported apart."""
    out = {}
    for provider, method, compile_ in SPECOPS:
        if not (rec.wants(provider) or provider == "specops_ar"):  # AR always runs: the baseline
            continue
        p = Specops(target, method, compile_)
        if compile_:
            before = dict(compiled.decoder_for(target).compile_s)
            _, secs = p.generate(first, new)
            rec.value(provider, base, "first_generate_s", "s", secs)
            for key, s in compiled.decoder_for(target).compile_s.items():
                if key not in before:
                    rec.value(provider, dict(base, bucket=key[0]), "compile_s", "s", s)
            print(f"# {provider}: first generate incl. compilation {secs:.1f} s", flush=True)
            p.warm = True
        else:
            p.generate(first, 8)
        out[provider] = p
    return out


def start_peers(threads, given, gguf, first, rec, base):
    """Every configured peer variant as a running process (``Peer``); the others are recorded as
    skipped with the reason."""
    out = {}
    for peer, (_, _, variants) in PEERS.items():
        python, why = interpreter(peer, given.get(peer))
        for variant in variants:
            provider = f"{peer}/{variant}"
            if not rec.wants(provider):
                continue
            setup = dict(variant=variant, threads=threads, warmup=list(first),
                         model_dir=os.path.join(models.cache_dir(), TARGET))
            if peer == "llama_cpp":
                setup["gguf"] = models.EMBEDDED[TARGET].locate(None) if variant.endswith("_q4_1") else gguf[0]
            reason = why or (gguf[1] if peer == "llama_cpp" and setup["gguf"] is None else None)
            if reason is None:
                try:
                    out[provider] = Peer(peer, python, setup)
                except PeerError as e:
                    reason = str(e)
            if reason is not None:
                rec.skip(provider, base, reason)
                print(f"# skipped {provider}: {reason}", flush=True)
                continue
            rec.value(provider, dict(base, engine=out[provider].engine), "startup_s", "s", out[provider].startup_s)
            print(f"# {provider} ({out[provider].engine}): start-up {out[provider].startup_s:.0f} s", flush=True)
    return out


def run_interleaved(providers, prompts, new, rec, base):
    """Every prompt through every provider in turn, each twice: one token (time to first token:
    the prefill and the first decode) and ``new`` tokens; the per-token decode time is the
    difference over ``new - 1`` tokens. Returns {provider: {category: (decode tok/s, median TTFT s)}}."""
    out = {name: {} for name in providers}
    for category, ids_list in prompts.items():
        acc = {name: [0, 0.0, []] for name in providers}  # decode tokens, decode seconds, TTFTs
        for ids in ids_list:
            for name, p in list(providers.items()):
                try:
                    _, ttft = p.generate(ids, 1)
                    n, total = p.generate(ids, new)
                except PeerError as e:  # a peer that dies mid-run: skipped from here on
                    rec.skip(name, dict(base, task=category), str(e))
                    print(f"# {name} failed: {e}", flush=True)
                    del providers[name]
                    continue
                acc[name][0] += n - 1
                acc[name][1] += total - ttft
                acc[name][2].append(ttft)
        for name in providers:
            tokens, secs, ttfts = acc[name]
            out[name][category] = (tokens / secs, statistics.median(ttfts))
            print(f"# {name} {category}: decode {tokens / secs:.1f} tok/s, "
                  f"first token {1e3 * statistics.median(ttfts):.0f} ms", flush=True)
    return {name: per for name, per in out.items() if per}


def bandwidth_limit(target):
    """tok/s at which the weights stream once per token at the measured copy bandwidth."""
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    gbps = machine_limits("cpu")["memcpy_gbps"]
    return gbps * 1e9 / weight_bytes, weight_bytes, gbps


def table(rates, categories, ttft):
    """Plain-text table: provider rows, decode tok/s per category, median, x specops_ar (per-category
    ratios' median), median time to first token."""
    ar = rates.get("specops_ar")
    head = f"{'provider':<26}" + "".join(f"{c[:8]:>9}" for c in categories) + f"{'median':>9}{'x AR':>7}{'TTFT ms':>9}"
    lines = [head]
    for name, per in rates.items():
        vals = [per.get(c) for c in categories]
        med = statistics.median(v for v in vals if v is not None)
        ratio = statistics.median(per[c] / ar[c] for c in categories if c in per and ar and c in ar) if ar else None
        lines.append(f"{name:<26}" + "".join(f"{v:9.1f}" if v is not None else f"{'-':>9}" for v in vals)
                     + f"{med:9.1f}" + (f"{ratio:7.2f}" if ratio is not None else f"{'-':>7}")
                     + (f"{1e3 * ttft[name]:9.0f}" if name in ttft else f"{'-':>9}"))
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
    first = next(iter(prompts.values()))[0]
    providers = start_specops(target, first, new, rec, base)
    peers = start_peers(threads, given, bf16_gguf(args.llama_convert, interpreter("llama_cpp", given.get("llama_cpp"))[0]), first, rec, base)
    providers.update(peers)
    try:
        results = run_interleaved(providers, prompts, new, rec, base)
    finally:
        for p in peers.values():
            p.close()
    rates = {name: {c: v[0] for c, v in per.items()} for name, per in results.items()}
    limit, weight_bytes, gbps = bandwidth_limit(target)
    rates["bandwidth_limit"] = dict.fromkeys(prompts, limit)
    rec.value("bandwidth_limit", dict(base, weight_bytes=weight_bytes, memcpy_gbps=round(gbps, 2)),
              "tokens_per_s", "tok/s", limit)
    ar = rates.get("specops_ar")
    for provider, per in rates.items():
        for category, v in per.items():
            rec.value(provider, dict(base, task=category), "decode_tokens_per_s", "tok/s", v)
            if ar is not None:
                rec.value(provider, dict(base, task=category), "speedup_vs_ar", "x", v / ar[category])
            if provider in results:
                rec.value(provider, dict(base, task=category), "time_to_first_token", "s", results[provider][category][1])
    out_dir = args.out or os.path.join(RESULTS, rec.info["machine"])
    csv_path = _write_merged(rec, out_dir, {r["provider"] for r in rec.rows})
    ttft = {name: statistics.median(v[1] for v in per.values()) for name, per in results.items()}
    print(table(rates, list(prompts), ttft))
    print(f"# decode tok/s per category (time to first token apart); bandwidth limit: {weight_bytes / 1e6:.0f} MB "
          f"of weights at {gbps:.1f} GB/s copy bandwidth; load average {os.getloadavg()[0]:.2f}")
    print(f"# wrote {csv_path}")
    return rec
