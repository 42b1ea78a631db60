"""Peer engines for ``bench/bench_decoding.py --compare-engines`` (docs/engines.md).

Each peer pins its own torch, so each runs in its own virtual environment and process: the
benchmark starts ``<peer python> bench/engines/peer_<name>.py`` once per variant and keeps it
running for the whole benchmark, so every provider can decode the same prompt in turn (interleaved
per prompt: load drift on the machine affects every provider alike). The line protocol (one JSON
object per line; the peer side is bench/engines/protocol.py): a setup line, answered with
{"ready", "engine", "startup_s"} once the engine is up and warmed; then one line per generation,
answered with {"tokens", "seconds"}. Peers are never dependencies of specops: a peer whose
interpreter is not given, or that fails to start or answer, is recorded as skipped with the reason.
"""
import json
import os
import select
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# peer -> (worker script, environment variable naming its interpreter, variants)
PEERS = {
    "vllm_cpu": ("peer_vllm.py", "SPECOPS_PEER_VLLM_PYTHON", ("plain", "ngram")),
    "llama_cpp": ("peer_llamacpp.py", "SPECOPS_PEER_LLAMACPP_PYTHON", ("plain", "prompt_lookup", "plain_q4_1")),
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


class PeerError(RuntimeError):
    pass


class Peer:
    """One running peer process (one engine variant). ``start`` blocks until the engine answered
    ready (its start-up and warm-up time is ``startup_s``); ``generate`` decodes one prompt."""

    def __init__(self, peer, python, setup, timeout=1800):
        self.timeout = timeout
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, OMP_NUM_THREADS=str(setup["threads"]))
        env.pop("PYTHONPATH", None)  # the peer's venv only: specops' torch must not leak in
        self.proc = subprocess.Popen([python, os.path.join(HERE, PEERS[peer][0])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, bufsize=0, env=env, cwd=HERE)
        self._buf = b""
        ready = self._ask(setup)
        self.engine, self.startup_s = ready["engine"], ready["startup_s"]

    def generate(self, ids, new_tokens):
        """Returns (tokens generated, seconds the engine's call took)."""
        out = self._ask({"ids": list(ids), "new_tokens": new_tokens})
        return out["tokens"], out["seconds"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.stderr.close()

    def _ask(self, obj):
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        except BrokenPipeError:
            raise PeerError(self._died()) from None
        while True:  # engines may log to stdout: the answer is the next line that is a JSON object
            line = self._line()
            if line.startswith("{"):
                out = json.loads(line)
                if "error" in out:
                    raise PeerError(out["error"])
                return out

    def _line(self):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], self.timeout)
            if not ready:
                self.proc.kill()
                raise PeerError(f"no answer within {self.timeout} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise PeerError(self._died())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def _died(self):
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        return f"exit {code}: {' | '.join(tail)[:300]}"
