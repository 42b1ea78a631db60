"""The peer side of the line protocol of bench/engines/__init__.py (imported by the peer workers,
which run in the peers' own venvs: standard library only, nothing of specops).

stdin line 1, the setup: {"variant", "threads", "warmup": [ids], ...engine fields}; the worker starts
its engine, decodes the warm-up prompt (8 tokens: lazy initialisation and any compilation happen
here) and answers {"ready": true, "engine": str, "startup_s": s}. Then per stdin line
{"ids": [ids], "new_tokens": n} one answer {"tokens": generated, "seconds": wall time of the call}.
EOF on stdin ends the worker. Any failure answers {"error": why} and exits 1."""
import json
import sys
import time
import traceback


def _answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(start):
    """``start(setup) -> (generate(ids, new_tokens) -> (tokens, seconds), engine name)``."""
    try:
        setup = json.loads(sys.stdin.readline())
        t0 = time.perf_counter()
        generate, engine = start(setup)
        generate(setup["warmup"], 8)
        _answer({"ready": True, "engine": engine, "startup_s": time.perf_counter() - t0})
        for line in sys.stdin:
            job = json.loads(line)
            n, seconds = generate(job["ids"], job["new_tokens"])
            _answer({"tokens": n, "seconds": seconds})
    except Exception as e:  # the harness records the peer as skipped with this reason
        traceback.print_exc(file=sys.stderr)
        _answer({"error": f"{type(e).__name__}: {e}"[:300]})
        sys.exit(1)
