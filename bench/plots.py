"""All benchmark plots from the CSVs (matplotlib, Agg backend, PNG).

    python -m bench.plots [--results bench/results/<machine>]     # -> <results>/plots/*.png

* ``speedup_<target>_<mode>_b<batch>.png``: speedup vs our AR per method per task (grouped bars;
  HF peers hatched), one figure per target / sampling / batch (decoding.csv).
* ``acceptance_vs_drafted_<target>_<mode>.png``: mean acceptance length vs drafted tokens per step,
  one point per chain/tree method and draft (mean over tasks, batch 1): the GSD/TSD trade-off. GSD
  also shows its draft-side node count (hollow marker joined to its point).
* ``kernel_<stem>.png``: per shape, the time of each baseline / the cpp kernel's (>1 = ours faster),
  from every kernel CSV.

Needs matplotlib: ``pip install 'specops[bench]'`` (or ``pip install matplotlib``).
"""
import argparse
import csv
import glob
import os
import sys

from . import _HERE  # noqa: F401
from . import paper_claims as F  # noqa: E402

OURS = ("cpp", "triton", "cuda")
TREE_CHAIN = ("sd", "specinfer", "tsd", "gsd", "opt-tree", "ouroboros", "mjsd")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench.plots needs matplotlib: pip install 'specops[bench]' (or pip install matplotlib)") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def speedup_plots(piv, out_dir, plt):
    written = []
    cases = sorted({k[:3] for k in piv})
    for target, mode, batch in cases:
        tasks = sorted({k[3] for k in piv if k[:3] == (target, mode, batch)})
        providers = []
        for k in piv:
            if k[:3] == (target, mode, batch) and k[4] != "ar" and k[4] not in providers \
                    and "speedup_vs_ar" in piv[k]:
                providers.append(k[4])
        if not tasks or not providers:
            continue
        width = 0.8 / len(providers)
        fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(tasks) * (1 + len(providers) / 8)), 5))
        cmap = plt.get_cmap("tab20")
        for i, p in enumerate(providers):
            ys = [piv.get((target, mode, batch, t, p), {}).get("speedup_vs_ar", 0) for t in tasks]
            xs = [j + (i - len(providers) / 2 + 0.5) * width for j in range(len(tasks))]
            ax.bar(xs, ys, width, label=p, color=cmap(i % 20), hatch="//" if p.startswith("hf_") else None,
                   edgecolor="black", linewidth=0.3)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(tasks)), tasks)
        ax.set_ylabel("speedup vs our autoregressive decoding (x)")
        ax.set_title(f"{target} (bf16), {mode}, batch {batch}:\ntok/s relative to our AR, same run", fontsize=10)
        ax.legend(fontsize=7, ncol=2 + len(providers) // 12, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        path = os.path.join(out_dir, f"speedup_{target}_{mode}_b{batch}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def acceptance_plots(piv, out_dir, plt):
    written = []
    for target, mode in sorted({(k[0], k[1]) for k in piv if k[2] == 1}):
        points = []
        for p in sorted({k[4] for k in piv if k[:3] == (target, mode, 1)}):
            if p.split("/")[0].split("@")[0] not in TREE_CHAIN or "/" not in p:
                continue
            mal = F.mean(piv, target, mode, 1, p, "mean_acceptance_length")
            drafted = F.mean(piv, target, mode, 1, p, "drafted_tokens_per_step")
            nodes = F.mean(piv, target, mode, 1, p, "drafted_nodes_per_step")
            if mal is not None and drafted is not None:
                points.append((p, drafted, mal, nodes))
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 5))
        cmap, kinds = plt.get_cmap("tab10"), sorted({p.split("/")[1] for p, *_ in points})
        seen = {}
        for p, x, y, nodes in points:
            method = p.split("/")[0]
            color = cmap(7 if "@" in method else TREE_CHAIN.index(method))
            ax.scatter([x], [y], s=40, color=color, marker="os^D"[kinds.index(p.split("/")[1]) % 4])
            # points that (nearly) coincide get their labels stacked instead of printed over each other
            spot = (round(x / 1.5), round(y / 0.25))
            slot = seen.setdefault(spot, 0)
            seen[spot] += 1
            ax.annotate(p, (x, y), textcoords="offset points", xytext=(5, 4 - 10 * slot), fontsize=8, color=color)
            if p.startswith("gsd/") and nodes is not None:
                ax.scatter([nodes - 1], [y], s=40, facecolors="none", edgecolors="gray")
                ax.plot([x, nodes - 1], [y, y], color="gray", linewidth=0.6, linestyle=":")
        ax.set_xlabel("drafted tokens per step (verified by the target; hollow: GSD's draft-side nodes)")
        ax.set_ylabel("mean acceptance length (tokens per target forward)")
        ax.set_title(f"{target}, {mode}, batch 1: acceptance vs drafting (mean over tasks)\n"
                     + ", ".join(f"{'os^D'[i % 4]} = {k} draft" for i, k in enumerate(kinds)), fontsize=10)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out_dir, f"acceptance_vs_drafted_{target}_{mode}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def kernel_plots(results_dir, out_dir, plt):
    written = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.csv"))):
        stem = os.path.basename(path)[:-4]
        if stem == "decoding":
            continue
        times = {}
        for r in _load(path):
            if r["metric"] == "time" and r["p50"]:
                times.setdefault(r["case"], {})[r["provider"]] = float(r["p50"])
        ours = next((o for o in OURS if any(o in t for t in times.values())), None)
        if ours is None:
            continue
        cases = [c for c, t in times.items() if ours in t]
        baselines = []
        for t in times.values():
            baselines += [p for p in t if p not in OURS and p not in baselines]
        if not cases or not baselines:
            continue
        fig, ax = plt.subplots(figsize=(9, max(3, 0.22 * len(cases) * max(1, len(baselines) / 2) + 1.5)))
        height = 0.8 / len(baselines)
        for i, b in enumerate(baselines):
            ys = [j + (i - len(baselines) / 2 + 0.5) * height for j in range(len(cases))]
            xs = [times[c][b] / times[c][ours] if b in times[c] else float("nan") for c in cases]
            ax.barh(ys, xs, height, label=f"{b} / {ours}")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yticks(range(len(cases)), [c.replace(",", ", ") for c in cases], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel(f"baseline time / {ours} time (> 1: {ours} faster), log scale")
        ax.set_title(f"{stem}: {ours} vs baselines per shape")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        out = os.path.join(out_dir, f"kernel_{stem}.png")
        fig.savefig(out, dpi=100 if len(cases) < 60 else 75)
        plt.close(fig)
        written.append(out)
    return written


def make_all(results_dir):
    plt = _pyplot()
    out_dir = os.path.join(results_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = kernel_plots(results_dir, out_dir, plt)
    decoding = os.path.join(results_dir, "decoding.csv")
    if os.path.exists(decoding):
        piv = F.pivot(F.load(decoding))
        written += speedup_plots(piv, out_dir, plt) + acceptance_plots(piv, out_dir, plt)
    return written


def main(argv=None):
    from _harness import RESULTS

    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, help="directory of CSVs (default: the only one under bench/results)")
    args = parser.parse_args(argv)
    results = args.results or F.only_dir(RESULTS)
    written = make_all(results)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"no plots: no usable CSVs under {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
