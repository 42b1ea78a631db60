"""Writes the README's results section from the benchmark CSVs (nothing typed by hand).

    python -m bench.readme [--results bench/results/<machine>] [--readme README.md]

Replaces the text between ``<!-- bench:begin -->`` and ``<!-- bench:end -->`` with, per op, a table of
median times (ms) per case and provider, the speedup of ours over each baseline measured in the same
run, and the machine's own limits; then the end-to-end table when ``decoding.csv`` exists.
"""
import argparse
import csv
import glob
import json
import os
import sys

from . import _HERE  # noqa: F401
from _harness import RESULTS  # noqa: E402

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
OURS = ("cpp", "triton", "cuda")


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _fmt(x):
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def kernel_table(rows):
    """Markdown: one line per case; a column per provider (median ms) and the cpp speedups."""
    times = {}
    for r in rows:
        if r["metric"] == "time":
            times.setdefault(r["case"], {})[r["provider"]] = float(r["p50"])
    providers = []
    for case in times.values():
        providers += [p for p in case if p not in providers]
    extra = {}
    for r in rows:
        if r["metric"] in ("pct_gemm_peak", "pct_memcpy") and r["provider"] in OURS:
            extra[(r["case"], r["provider"])] = f"{float(r['p50']):.0f}% {'GEMM' if 'gemm' in r['metric'] else 'memcpy'}"
    ours = [p for p in OURS if p in providers]
    head = ["case"] + [f"{p} ms" for p in providers] + [f"{o} vs {p}" for o in ours for p in providers
                                                         if p not in OURS] + [f"{o} of limit" for o in ours]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, t in times.items():
        cells = [case.replace(",", ", ")] + [_fmt(t[p]) if p in t else "–" for p in providers]
        for o in ours:
            for p in providers:
                if p not in OURS:
                    cells.append(f"{t[p] / t[o]:.2f}x" if o in t and p in t else "–")
        cells += [extra.get((case, o), "–") for o in ours]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(results_dir):
    files = sorted(glob.glob(os.path.join(results_dir, "*.csv")))
    if not files:
        raise SystemExit(f"no CSVs under {results_dir}: run `python -m bench` first")
    out = []
    first = load(files[0])
    info = first[0]
    limits = {r["metric"]: float(r["p50"]) for r in first if r["provider"] == "machine"}
    out.append(f"Measured {info['timestamp'][:10]} on {info['cpu']} ({info['threads']} threads), torch "
               f"{info['torch']}, triton {info['triton']}, specops {info['git_sha']}. Machine limits measured in "
               "the same runs: " + ", ".join(f"{k} {v:.0f}" for k, v in limits.items()) + ".")
    out.append("Reproduce: `python -m bench` then `python -m bench.readme`. Times are medians; the CSVs "
               f"(`{os.path.relpath(results_dir)}`) hold p20/p80 spreads. GPU rows appear only once measured on a GPU.")
    for path in files:
        stem = os.path.basename(path)[:-4]
        rows = load(path)
        if stem == "decoding":
            continue
        skipped = sorted({(r["provider"], r["unit"]) for r in rows if r["metric"] == "skipped"})
        out.append(f"\n### {stem}\n\n{kernel_table(rows)}")
        if skipped:
            out.append("\nNot measured here: " + "; ".join(f"{p} ({why})" for p, why in skipped) + ".")
    decoding = os.path.join(results_dir, "decoding.csv")
    if os.path.exists(decoding):
        out.append("\n### end to end\n\n" + decoding_table(load(decoding)))
    return "\n".join(out)


def decoding_table(rows):
    """Markdown: one line per (task, method, draft): tok/s, speedup vs AR, mean acceptance length,
    drafted tokens per step."""
    by_key = {}
    for r in rows:
        params = json.loads(r["params"])
        key = (params.get("task", ""), params.get("mode", ""), r["provider"])
        by_key.setdefault(key, {})[r["metric"]] = float(r["p50"]) if r["p50"] else None
    head = ["task", "sampling", "method", "tok/s", "speedup vs AR", "mean acceptance length", "drafted tokens/step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, mode, provider), m in sorted(by_key.items()):
        def cell(name, fmt="{:.2f}"):
            return fmt.format(m[name]) if m.get(name) is not None else "–"
        lines.append(f"| {task} | {mode} | {provider} | {cell('tokens_per_s', '{:.1f}')} | {cell('speedup_vs_ar')}x | "
                     f"{cell('mean_acceptance_length')} | {cell('drafted_tokens_per_step', '{:.1f}')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.readme", description=__doc__)
    parser.add_argument("--results", default=None, help="directory of CSVs (default: the only one under bench/results)")
    parser.add_argument("--readme", default=os.path.join(os.path.dirname(_HERE), "README.md"))
    args = parser.parse_args(argv)
    results = args.results
    if results is None:
        dirs = sorted(d for d in glob.glob(os.path.join(RESULTS, "*")) if os.path.isdir(d))
        if len(dirs) != 1:
            raise SystemExit(f"pass --results: found {dirs or 'no result directories'}")
        results = dirs[0]
    with open(args.readme) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.readme} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(args.readme, "w") as f:
        f.write(head + BEGIN + "\n" + section(results) + "\n" + END + tail)
    print(f"updated {args.readme} from {results}")


if __name__ == "__main__":
    sys.exit(main())
