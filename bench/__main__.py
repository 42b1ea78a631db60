"""Runs every benchmark through the one harness and writes long-format CSVs.

    python -m bench [--quick] [--only tree_mask,kv_compact] [--out DIR] [--compare DIR]
    specops bench ...            (the same, from a source checkout)

Each ``bench_<stem>.py`` contributes ``bench/results/<machine>/<stem>.csv``; ``--compare DIR`` prints
the cases whose median time regressed by more than 10 % against the CSVs in DIR.
"""
import argparse
import importlib
import os
import pkgutil
import sys

from . import _HERE  # noqa: F401  (puts bench/ on sys.path for the bench files)
from _harness import RESULTS, Recorder, compare, machine_info  # noqa: E402


def stems():
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([os.path.dirname(__file__)])
                  if m.name.startswith("bench_"))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes and budgets (smoke test)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {stems()}")
    parser.add_argument("--out", default=None, help="directory for the CSVs (default bench/results/<machine>)")
    parser.add_argument("--compare", default=None, help="directory of earlier CSVs to compare against")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else stems()
    unknown = set(chosen) - set(stems())
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {stems()}")
    device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    out = args.out or os.path.join(RESULTS, machine_info(device)["machine"])
    regressions = 0
    for stem in chosen:
        module = importlib.import_module(f"bench_{stem}")
        op = getattr(module, "OP", stem)
        rec = Recorder(op, device, args.quick)
        module.measure(rec, args.quick)
        path = rec.write(out)
        print(rec.table(metrics=("time", "throughput", "bandwidth", "pct_gemm_peak", "pct_memcpy", "lower_bound")))
        print(f"# wrote {path}\n", flush=True)
        old = os.path.join(args.compare, os.path.basename(path)) if args.compare else None
        if old and os.path.exists(old):
            for key, before, now in compare(path, old):
                regressions += 1
                print(f"REGRESSION {key}: {before:.4g} -> {now:.4g} ms")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
