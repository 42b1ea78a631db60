"""The emulator's speed (run by hand; docs/testing.md quotes it) on tests/test_cudasim.py's kernel cases.
Prints the best of --reps wall times of each case, racecheck off and on, and their sums:

    python tests/cudasim_speed.py [--reps 3] [--only tree_attention linear ...] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import timeit


def best(fn, reps):
    return min(timeit.repeat(fn, number=1, repeat=reps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--json")
    args = ap.parse_args()
    import test_cudasim  # this script's folder, tests/, is on sys.path
    from _cudasim import racecheck_built

    import specops
    if test_cudasim.sim is None:
        raise SystemExit("specops._C_cudasim is not built")
    sim, cases, checked = test_cudasim.sim, test_cudasim.CASES, racecheck_built()
    print(f"# {specops.extension.cudasim_ext.__file__}  load average {os.getloadavg()[0]:.2f}")
    rows = {}
    print(f"{'case':40s} {'off s':>8s} {'on s':>8s}")
    for name, case in cases.items():
        if args.only and name not in args.only:
            continue
        sim.set_racecheck(False)
        case()  # warm-up (lazy plans, shadow maps)
        off = best(case, args.reps)
        sim.set_racecheck(checked)  # NaN in a build without the instrumentation
        on = best(case, args.reps) if checked else float("nan")
        rows[name] = (off, on)
        print(f"{name:40s} {off:8.3f} {on:8.3f}", flush=True)
    off, on = sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())
    print(f"{'total':40s} {off:8.3f} {on:8.3f}   load average {os.getloadavg()[0]:.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
