"""Peer engines for ``bench/bench_decoding.py --compare-engines`` (docs/engines.md).

Each peer pins its own torch, so each runs in its own virtual environment and process: the
benchmark starts ``<peer python> bench/engines/peer_<name>.py``, writes one JSON job on its stdin
(model location, the prompts as token ids per category, new tokens, threads, variant) and reads one
JSON line back (per category: tokens generated and seconds; the engine's version and start-up
time). Peers are never dependencies of specops: a peer whose interpreter is not given, or that
fails to start, is recorded as skipped with the reason.
"""
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))

# peer -> (worker script, environment variable naming its interpreter, variants)
PEERS = {
    "vllm_cpu": ("peer_vllm.py", "SPECOPS_PEER_VLLM_PYTHON", ("plain", "ngram")),
    "llama_cpp": ("peer_llamacpp.py", "SPECOPS_PEER_LLAMACPP_PYTHON", ("plain", "prompt_lookup")),
}


def interpreter(peer, given=None):
    """The peer's Python: ``given`` (``--engine-python peer=PATH``), else its environment
    variable. Returns (path or None, why not)."""
    script, env, _ = PEERS[peer]
    path = given or os.environ.get(env)
    if not path:
        return None, f"not configured: pass --engine-python {peer}=/path/to/venv/bin/python or set {env}"
    if not os.path.exists(path):
        return None, f"no interpreter at {path}"
    return path, None


def run(peer, python, job, timeout=3600):
    """Runs one variant of ``peer`` on ``job`` in its own process. Returns the worker's result
    dict, or {"error": why} (start-up failure, crash, timeout, bad output)."""
    script = os.path.join(HERE, PEERS[peer][0])
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]))
    env.pop("PYTHONPATH", None)  # the peer's venv only: specops' torch must not leak in
    try:
        proc = subprocess.run([python, script], input=json.dumps(job), capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:300]}"}
    return json.loads(lines[-1])
