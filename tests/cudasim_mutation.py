"""The barrier-removal run of docs/cudasim.md (run by hand): prints that page's markdown table.
For every `__syncthreads()` in csrc/cuda/, one at a time: take the barrier out (--mode site: the emulator's
`SPECOPS_CUDASIM_REMOVE_BARRIER=file:line`; --mode source: deleted in a copy under --workdir, `_C_cudasim`
rebuilt, to spot-check that the two agree), run the tests docs/cudasim.md names under racecheck, and record
what caught it: a hazard (kind and both source lines), another failure, or nothing.

    python tests/cudasim_mutation.py [--only verify.cu:38 ...] [--mode site|source] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA = ROOT / "csrc" / "cuda"

# The tests that run each source's kernels under the emulator: tests/test_<stem>.py, except for these.
FAMILY = {"kv_compact.cu": ["tests/test_kv_compact.py", "tests/test_kv_compact_grid.py"],
          "sampling_block.cuh": ["tests/test_sampling.py", "tests/test_topn.py"],
          "tree_attention_tc.cuh": ["tests/test_tree_attention.py"],
          "verify_engine.cuh": ["tests/test_verify.py"]}
# test_cudasim.py's kernel tests (not its self-tests of the emulator), first: every kernel under racecheck.
KERNEL_TESTS = "cudasim and (thread_order or hazard_free)"


def barriers():
    """(file name, line, the line's text) of every __syncthreads() call in csrc/cuda/."""
    out = []
    for path in sorted(CUDA.glob("*.cu")) + sorted(CUDA.glob("*.cuh")):
        for i, text in enumerate(path.read_text().splitlines(), 1):
            code = text.split("//")[0]
            if "__syncthreads()" in code:
                out.append((path.name, i, text.strip()))
    return out


def classify(output, rc):
    """hazard / failure / nothing, with the evidence."""
    if rc == 0:
        return "nothing", ""
    if rc == "timeout" and "cudasim racecheck:" not in output and "FAILED" not in output:
        return "nothing", f"no failure in the tests run within the time limit ({output.count('.')} passed)"
    m = re.search(r"cudasim racecheck: [^\n]*", output)
    if m:
        text = m.group(0)
        kind = re.search(r"\((RAW|WAR|WAW)\)", text).group(1)
        sites = re.findall(r"it at (\S+:\d+)", text)
        return "hazard", f"{kind} {' / '.join(sites)}"
    failed = re.search(r"^FAILED (\S+)(?: - (.*))?$", output, re.M)
    why = f"{failed.group(1)}: {(failed.group(2) or 'assertion')[:120]}" if failed else output.strip().splitlines()[-1][:160]
    if rc == 5 or "no tests ran" in output:
        return "error", why
    return "failure", why


def run_tests(root, files, env, timeout=None):
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore",
           "tests/test_cudasim.py", *files, "-k", f"(cudasim and not test_cudasim) or ({KERNEL_TESTS})"]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return (e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")), "timeout"
    return p.stdout + p.stderr, p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["site", "source"], default="site")
    ap.add_argument("--only", nargs="*", help="file:line of the barriers to try (default: all)")
    ap.add_argument("--workdir", default="/tmp/specops-mutation", help="the copy --mode source edits and builds")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true", help="test_cudasim.py's kernel tests only, not the family's")
    ap.add_argument("--timeout", type=float, help="seconds per barrier; a run cut off without a failure is 'nothing'")
    args = ap.parse_args()

    env = dict(os.environ, SPECOPS_CUDASIM_RACECHECK="1", PYTHONUNBUFFERED="1")
    root = ROOT if args.mode == "site" else pathlib.Path(args.workdir)
    if args.mode == "source":
        if not root.exists():
            shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(".git", "build", "*.so", "__pycache__", ".venv"))
        env.update(SPECOPS_CUDA="0", MAX_JOBS=env.get("MAX_JOBS", "1"), PYTHONPATH=str(root))

    def build():
        b = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=root, env=env,
                           capture_output=True, text=True)
        if b.returncode:
            sys.exit(f"build failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}")

    results = []
    print("| barrier | source line | outcome | evidence | seconds |")
    print("| --- | --- | --- | --- | --- |")
    for name, line, text in barriers():
        site = f"{name}:{line}"
        if args.only and site not in args.only:
            continue
        t0 = time.time()
        files = [] if args.quick else FAMILY.get(name, [f"tests/test_{name.split('.')[0]}.py"])
        if args.mode == "site":
            output, rc = run_tests(root, files, dict(env, SPECOPS_CUDASIM_REMOVE_BARRIER=site), args.timeout)
        else:
            path = root / "csrc" / "cuda" / name
            original = path.read_text()
            lines = original.splitlines(keepends=True)
            lines[line - 1] = lines[line - 1].replace("__syncthreads();", ";", 1)  # line numbers stay
            path.write_text("".join(lines))
            try:
                build()
                output, rc = run_tests(root, files, env, args.timeout)
            finally:
                path.write_text(original)
        outcome, evidence = classify(output, rc)
        seconds = time.time() - t0
        results.append({"site": site, "text": text, "outcome": outcome, "evidence": evidence, "seconds": round(seconds)})
        print(f"| {site} | `{text}` | {outcome} | {evidence} | {seconds:.0f} |", flush=True)
    if args.mode == "source":
        build()  # leave the copy as the sources are
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
