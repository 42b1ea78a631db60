"""Writes the README's results section from the benchmark CSVs (nothing typed by hand).

    python -m bench.readme [--results bench/results/<machine>] [--readme README.md]

Replaces the text between ``<!-- bench:begin -->`` and ``<!-- bench:end -->`` with, per op, a table of
median times (ms) per case and provider, the speedup of ours over each baseline measured in the same
run, and the machine's own limits; then, when ``decoding.csv`` exists, the end-to-end summary (per
task: AR, the best specops method, the best HF peer), the seeds' findings (bench/findings.py), links
to the plots (``python -m bench.plots``) and the full per-provider table. Each part names its
command, machine and date.
"""
import argparse
import csv
import glob
import json
import os
import sys

from . import _HERE  # noqa: F401
from . import findings  # noqa: E402
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


def _kernel_csvs(results_dir):
    return [p for p in sorted(glob.glob(os.path.join(results_dir, "*.csv"))) if os.path.basename(p) != "decoding.csv"]


def section(results_dir, readme_dir=None):
    """The generated markdown: kernel tables, then the end-to-end summary, the seeds' findings, the
    plots and the full end-to-end table, each with its command, machine and date."""
    kernels = _kernel_csvs(results_dir)
    decoding = os.path.join(results_dir, "decoding.csv")
    if not kernels and not os.path.exists(decoding):
        raise SystemExit(f"no CSVs under {results_dir}: run `python -m bench` first")
    rel = os.path.relpath(results_dir, readme_dir or os.path.dirname(_HERE))
    out = []
    if kernels:
        first = load(kernels[0])
        out.append(_machine_line(first, "kernels") + " Machine limits measured in the same runs: "
                   + ", ".join(f"{r['metric']} {float(r['p50']):.0f}" for r in first if r["provider"] == "machine") + ".")
        out.append("Reproduce: `python -m bench` then `python -m bench.plots` and `python -m bench.readme`. Times are "
                   f"medians; the CSVs (`{rel}`) hold p20/p80 spreads. GPU rows appear only once measured on a GPU.")
    for path in kernels:
        stem = os.path.basename(path)[:-4]
        rows = load(path)
        skipped = sorted({(r["provider"], r["unit"]) for r in rows if r["metric"] == "skipped"})
        out.append(f"\n### {stem}\n\nCommand: `python -m bench --only {stem}` ({_when(rows)}).\n\n{kernel_table(rows)}")
        if skipped:
            out.append("\nNot measured here: " + "; ".join(f"{p} ({why})" for p, why in skipped) + ".")
        plot = os.path.join(results_dir, "plots", f"kernel_{stem}.png")
        if os.path.exists(plot):
            out.append(f"\nPlot: [{stem}: baseline time / ours per shape]({rel}/plots/kernel_{stem}.png)")
    if os.path.exists(decoding):
        rows = load(decoding)
        out.append("\n### end to end\n\n" + _machine_line(rows, "end to end") + " Command: `python "
                   "bench/bench_decoding.py --profile final` (plan and cost: the module docstring), then "
                   "`python -m bench.plots` and `python -m bench.readme`. tok/s = generated tokens / wall time, "
                   "prefill included, summed over the task's prompts; every ratio compares runs of the same process."
                   + _reruns(rows))
        out.append("\n" + summary_table(rows))
        out.append("\n#### The seeds' findings on our models\n\nFrom `python -m bench.findings` (rules in "
                   "bench/findings.py).\n\n" + findings.markdown(findings.findings(rows)))
        plots = sorted(glob.glob(os.path.join(results_dir, "plots", "*.png")))
        plots = [p for p in plots if not os.path.basename(p).startswith("kernel_")]
        if plots:
            out.append("\n#### Plots\n\n" + "\n".join(f"- [{os.path.basename(p)[:-4]}]({rel}/plots/{os.path.basename(p)})"
                                                   for p in plots))
        out.append("\n<details><summary>Every provider on every case</summary>\n\n" + decoding_table(rows)
                   + "\n\n</details>")
    return "\n".join(out)


def _when(rows):
    info = rows[0]
    return f"{info['timestamp'][:10]}, specops {info['git_sha']}"


def _reruns(rows):
    """Names the cases a later partial run (``--tasks`` / ``--modes``) replaced, if any."""
    runs = {}
    for r in rows:
        if r["provider"] != "machine":
            p = json.loads(r["params"] or "{}")
            runs.setdefault((r["git_sha"], r["timestamp"]), set()).add(
                f"{p.get('target')} {p.get('task')} {p.get('mode')} b{p.get('batch')}")
    if len(runs) < 2:
        return ""
    main = max(runs, key=lambda k: len(runs[k]))
    later = sorted(c for k, cases in runs.items() if k != main for c in cases)
    return (f" Rerun later in a separate run on the same machine: {', '.join(later)} "
            f"(rows carry their git sha and time).")


def _machine_line(rows, what):
    info = rows[0]
    n = int(info["threads"])
    return (f"Measured ({what}) {info['timestamp'][:10]} on {info['cpu']} ({info['machine']}, {n} "
            f"thread{'s' if n != 1 else ''}), torch {info['torch']}, triton {info['triton']}, specops {info['git_sha']}.")


def summary_table(rows):
    """Markdown: per (target, sampling, batch, task): AR tok/s, the best specops method and the best
    HF peer with their tok/s, and the ratio between them."""
    piv = findings.pivot(rows)
    head = ["target", "sampling", "batch", "task", "AR tok/s", "best specops method", "tok/s", "vs AR",
            "best HF peer", "tok/s", "specops / HF"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    vs_hf, code_edit = [], []
    for target, mode, batch, task in sorted({k[:4] for k in piv}):
        cell = {k[4]: v for k, v in piv.items() if k[:4] == (target, mode, batch, task)}
        ar = cell.get("ar", {}).get("tokens_per_s")
        ours = {p: v["tokens_per_s"] for p, v in cell.items()
                if "tokens_per_s" in v and p != "ar" and not p.startswith("hf_")}
        peers = {p: v["tokens_per_s"] for p, v in cell.items() if "tokens_per_s" in v and p.startswith("hf_")}
        if ar is None or not ours:
            continue
        best = max(ours, key=ours.get)
        hf = max(peers, key=peers.get) if peers else None
        lines.append(f"| {target} | {mode} | {batch} | {task} | {ar:.1f} | {best} | {ours[best]:.1f} | "
                     f"{ours[best] / ar:.2f}x | {hf or '–'} | {_fmt(peers[hf]) if hf else '–'} | "
                     f"{f'{ours[best] / peers[hf]:.2f}x' if hf else '–'} |")
        if hf:
            vs_hf.append((str(batch) == "1", ours[best] / peers[hf] >= 1.5))
        if task == "code_edit":
            code_edit.append(ours[best] / ar >= 3)
    per_cat = [ok for b1, ok in vs_hf if b1]
    lines.append(f"\nIssue #6 targets on this run: best specops method >= 1.5x the best HF peer on {sum(per_cat)} of "
                 f"{len(per_cat)} (target, sampling, prompt category) cases at batch 1, and on "
                 f"{sum(ok for _, ok in vs_hf)} of {len(vs_hf)} cases counting the mixed batch-4 rows; "
                 f">= 3x AR on code-editing prompts in {sum(code_edit)} of {len(code_edit)} cases.")
    return "\n".join(lines)


def decoding_table(rows):
    """Markdown: one line per (target, task, sampling, batch, provider): tok/s, speedup vs AR and vs
    the best HF peer, mean acceptance length, drafted tokens per step, time split, deviation."""
    piv = findings.pivot(rows)
    head = ["target", "task", "sampling", "batch", "provider", "tok/s", "vs AR", "vs best HF", "MAL",
            "drafted/step", "draft/verify/other %", "differs from AR %", "ppl vs AR"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (target, mode, batch, task, provider), m in sorted(piv.items()):
        def cell(name, fmt="{:.2f}"):
            return fmt.format(m[name]) if m.get(name) is not None else "–"
        split = "–" if "time_draft_share" not in m else (
            f"{m['time_draft_share']:.0f}/{m['time_verify_share']:.0f}/"
            f"{m['time_bookkeeping_share'] + m.get('time_prefill_share', 0):.0f}")
        lines.append(f"| {target} | {task} | {mode} | {batch} | {provider} | {cell('tokens_per_s', '{:.1f}')} | "
                     f"{cell('speedup_vs_ar')} | {cell('speedup_vs_best_hf')} | {cell('mean_acceptance_length')} | "
                     f"{cell('drafted_tokens_per_step', '{:.1f}')} | {split} | "
                     f"{cell('tokens_differing_from_ar', '{:.1f}')} | {cell('perplexity_vs_ar', '{:.3f}')} |")
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
        f.write(head + BEGIN + "\n" + section(results, os.path.dirname(os.path.abspath(args.readme))) + "\n" + END + tail)
    print(f"updated {args.readme} from {results}")


if __name__ == "__main__":
    sys.exit(main())
