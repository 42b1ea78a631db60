"""``bench/bench_decoding.py --tp N``: end-to-end decoding on a tensor-parallel target against the
same runs in one process (docs/scaling.md §Measuring the overhead).

Run without torchrun: this process times the one-process runs (``--threads`` threads, default N),
then launches ``torchrun --nproc-per-node N`` on this file (``OMP_NUM_THREADS=1`` per rank, one core
each) and prints one table: tok/s per method, the TP/one-process ratio, and the share of rank 0's
step time spent in collectives (c10d ops and their waits, from torch.profiler in a second, profiled
run) and in DTensor redistribution (transformers' TP layers). On a machine with fewer cores than
ranks x threads this measures overhead, not speedup.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["Explain hash tables.", "Write a Python function that reverses a linked list.",
           "Summarize the causes of the French Revolution in three sentences."]


def _runs(target, tok, methods, new_tokens, repeats, tp_size, profile):
    """-> {method: {"tok_s": median, "runs": [...], "collective_share": x, "redistribute_share": y}}."""
    import specops

    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]
    ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
    out = {}
    for method in methods:
        kw = dict(method=method, max_new_tokens=new_tokens, tokenizer=tok, tp_size=tp_size)
        specops.generate(target, [ids[0]], **dict(kw, max_new_tokens=4))  # warm-up
        rates = []
        for _ in range(repeats):
            for p in ids:
                _, m = specops.generate(target, [p], **kw)
                rates.append(m.tokens_per_s)
        row = {"tok_s": statistics.median(rates), "runs": rates}
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as prof

            with prof(activities=[ProfilerActivity.CPU]) as p:
                t = time.perf_counter()
                specops.generate(target, [ids[0]], **kw)
                wall = time.perf_counter() - t
            coll = sum(e.self_cpu_time_total for e in p.key_averages() if "c10d" in e.key) / 1e6
            redis = sum(e.self_cpu_time_total for e in p.key_averages() if e.key == "Redistribute") / 1e6
            row.update(collective_share=coll / wall, redistribute_share=redis / wall)
        out[method] = row
    return out


def _load(name, tp_size):
    from specops import models

    return models.load_any(name, "bf16", tp_size=tp_size)


def worker(args):
    """One rank under torchrun: writes rank 0's results to ``args.out``."""
    import torch

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    target, tok = _load(args.target, world)
    res = _runs(target, tok, args.methods.split(","), args.new_tokens, args.repeats, world, profile=True)
    if int(os.environ["RANK"]) == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    return 0


def run(tp, target="smollm2-135m", methods="ar,ngram,tsd", new_tokens=48, repeats=1, threads=None):
    """The one-process runs here, the TP runs under torchrun; prints and returns the table rows."""
    import torch

    torch.set_num_threads(threads or tp)
    one_target, tok = _load(target, 1)
    one = _runs(one_target, tok, methods.split(","), new_tokens, repeats, 1, profile=False)
    del one_target
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "tp.json")
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
               os.path.abspath(__file__), "--worker", "--target", target, "--methods", methods,
               "--new-tokens", str(new_tokens), "--repeats", str(repeats), "--out", out]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the TP run failed:\n{proc.stderr[-4000:]}")
        with open(out) as f:
            par = json.load(f)
    rows = []
    print(f"{target} bf16, greedy, {new_tokens} new tokens, {len(PROMPTS)} chat prompts x {repeats}; "
          f"one process: {threads or tp} threads; TP {tp}: 1 thread per rank")
    print(f"{'method':<8} {'1 proc tok/s':>12} {f'TP {tp} tok/s':>11} {'TP/1':>6} {'collectives':>12} {'redistribute':>13}")
    for m in methods.split(","):
        a, b = one[m]["tok_s"], par[m]["tok_s"]
        row = {"method": m, "one_tok_s": a, "tp_tok_s": b, "ratio": b / a,
               "collective_share": par[m]["collective_share"], "redistribute_share": par[m]["redistribute_share"]}
        rows.append(row)
        print(f"{m:<8} {a:12.1f} {b:11.1f} {b / a:6.2f} {row['collective_share']:11.0%} {row['redistribute_share']:12.0%}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--methods", default="ar,ngram,tsd")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    run(args.tp, args.target, args.methods, args.new_tokens, args.repeats, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
