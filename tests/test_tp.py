"""Tensor parallelism (docs/scaling.md): the loop and every method on a target sharded over 2 gloo
ranks by transformers (torchrun, one thread per rank), against the same runs in one process. One
torchrun launch runs every case (tests/tp_worker.py); the tests read its per-rank results (``-m tp``)."""
import functools
import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch
from test_models import needs_smollm2

import specops
from specops import parallel
from specops.testing import perturbed_copy, tiny_causal_lm

pytestmark = [pytest.mark.tp, pytest.mark.usefixtures("one_thread")]

WORLD = 2
N_NEW = 12
METHODS = ["ar", "sd", "specinfer", "tsd", "gsd", "opt-tree", "ouroboros", "mjsd", "ngram"]
LOSSY = {"mjsd"}  # joint-likelihood acceptance: deterministic, but not AR's output


def _prompts():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 11, 3)]


def _case(cid, target, kw, draft=True, **extra):
    kw = {"max_new_tokens": N_NEW, "eos_token_id": [], **kw}
    return {"id": cid, "target": target, "draft": f"{target}-draft" if draft else None, "prompts": _prompts(),
            "kw": kw, **extra}


def _cases():
    cases = []
    for arch in ("llama", "qwen2"):  # greedy, adaptive (the default), contiguous
        cases += [_case(f"{arch}-{m}-greedy-adaptive", arch, {"method": m}) for m in METHODS]
    # fixed budgets on the paged layout; sampled with the adaptive controller deciding on rank 0
    cases += [_case(f"llama-{m}-greedy-fixed-paged", "llama",
                    {"method": m, "adaptive": False, "kv_layout": "paged", "page_size": 4}) for m in METHODS]
    cases += [_case(f"qwen2-{m}-sampled-adaptive", "qwen2", {"method": m, "temperature": 0.8, "top_p": 0.95, "seed": 3})
              for m in METHODS]
    cases += [_case(f"llama-{m}-sampled-fixed", "llama", {"method": m, "temperature": 0.8, "adaptive": False, "seed": 7})
              for m in ("sd", "tsd", "specinfer")]
    cases.append(_case("llama-tsd-skewed-costs", "llama", {"method": "tsd", "skew_costs": True}))
    # generate loads the target itself, sharded over the torchrun world (tp_size from WORLD_SIZE)
    cases.append(_case("path-tsd", "llama", {"method": "tsd", "dtype": "fp32"}, by_path=True))
    cases.append(_case("uneven-heads", "uneven", {"method": "ar"}, draft=False))
    cases.append(_case("tp-size-mismatch", "llama", {"method": "ar", "tp_size": 3}, draft=False))
    # ranks that sample with different seeds diverge: the debug check names the step
    cases.append(_case("diverged", "qwen2", {"method": "sd", "temperature": 1.0, "seed_per_rank": 0,
                                            "env": {parallel.CHECK_ENV: "1"}}))
    return cases


def _run(args, timeout=400, **env):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _torchrun(args, timeout=400):
    """``args`` (a script, or ``-m`` and a module) on WORLD ranks, one thread each."""
    return _run(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", *args], timeout,
                OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Saves the tiny models, runs every case on WORLD ranks; -> (dir, cases by id, results per rank)."""
    d = tmp_path_factory.mktemp("tp")
    for arch in ("llama", "qwen2"):
        target = tiny_causal_lm(arch, seed=0)
        target.save_pretrained(d / arch)
        perturbed_copy(target, 0.15, seed=1).save_pretrained(d / f"{arch}-draft")
    _uneven_heads_model().save_pretrained(d / "uneven")
    cases = _cases()
    (d / "cases.json").write_text(json.dumps(cases))
    proc = _torchrun([os.path.join(os.path.dirname(__file__), "tp_worker.py"), "--dir", str(d)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((d / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return d, {c["id"]: c for c in cases}, ranks


def _uneven_heads_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@functools.cache
def _unsharded(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _one_process(d, case):
    """The same case in this process on the unsharded models."""
    draft = _unsharded(d / case["draft"]) if case["draft"] else None
    toks, m = specops.generate(_unsharded(d / case["target"]), case["prompts"], draft=draft, **case["kw"])
    return [toks[b, : m.lengths[b]].tolist() for b in range(toks.shape[0])]


def _ar_tokens(d, case, *drop):
    """AR's tokens for ``case`` without the keywords ``drop``, in one process (a lossless method's output)."""
    kw = {k: v for k, v in case["kw"].items() if k not in drop}
    return _one_process(d, dict(case, kw=dict(kw, method="ar"), draft=None))


def _tokens(ranks, cid):
    """The tokens of case ``cid``, once no rank raised and every rank emitted the same."""
    got = [r[cid] for r in ranks]
    for r, g in enumerate(got):
        assert "error" not in g, f"rank {r}: {g['error']}"
    toks = [g["tokens"] for g in got]
    assert all(t == toks[0] for t in toks), f"ranks differ: {toks}"
    return toks[0]


def _ids(pattern):
    return [c["id"] for c in _cases() if pattern(c)]


@pytest.mark.parametrize("cid", _ids(lambda c: "greedy" in c["id"] or c["id"] == "path-tsd"))
def test_greedy_is_identical_on_every_rank_and_to_one_process(tp_run, cid):
    d, cases, ranks = tp_run
    toks, case = _tokens(ranks, cid), cases[cid]
    if case["kw"]["method"] not in LOSSY:
        assert toks == _ar_tokens(d, case, "tp_size", "dtype")
    elif not case["kw"].get("adaptive", True):
        # MJSD's output follows its budgets, which follow each process's measured step times: every
        # rank takes rank 0's (above); against one process only with fixed budgets
        assert toks == _one_process(d, case)


@pytest.mark.parametrize("cid", _ids(lambda c: "sampled" in c["id"]))
def test_sampled_runs_are_identical_on_every_rank(tp_run, cid):
    assert all(len(seq) == N_NEW for seq in _tokens(tp_run[2], cid))


@pytest.mark.parametrize("cid", _ids(lambda c: "sampled-fixed" in c["id"]))
def test_sampled_fixed_budgets_match_one_process(tp_run, cid):
    """Same seed, same gathered logits (up to the sharded matmuls' rounding): the same draws."""
    d, cases, ranks = tp_run
    assert _tokens(ranks, cid) == _one_process(d, cases[cid])


def test_adaptive_budgets_are_rank_zeros_on_every_rank(tp_run):
    """Rank 0's step costs favour drafting, rank 1's favour AR steps: both run rank 0's budgets."""
    d, cases, ranks = tp_run
    cid = "llama-tsd-skewed-costs"
    got = [(r[cid]["budget_steps"], r[cid]["ar_steps"]) for r in ranks]
    assert got[0] == got[1] and got[0][0] > 0, got
    assert _tokens(ranks, cid) == _ar_tokens(d, cases[cid], "skew_costs")


@pytest.mark.parametrize("cid, exc, fragments", [
    ("uneven-heads", "ValueError", ("(3)", "(2)")),  # both numbers named
    ("tp-size-mismatch", "ValueError", ("tp_size=3", "2 rank")),  # tp_size must match a sharded model
    ("diverged", "RuntimeError", ("diverged at decode step", "rank(s) [1]")),  # at the first differing step
])
def test_cases_that_must_raise_do_so_on_every_rank(tp_run, cid, exc, fragments):
    for r in tp_run[2]:
        err = r[cid].get("error", "")
        assert err.startswith(exc) and all(f in err for f in fragments), err


# ---- one process: the contracts that need no second rank ------------------------------------------

def _sharded(heads, kv, tp, plan):
    """What transformers sets on a sharded model, on a stand-in."""
    from transformers import LlamaConfig

    config = LlamaConfig(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=16 * heads)
    return types.SimpleNamespace(config=config, _tp_size=tp, tp_plan=plan)


def test_local_kv_heads_follow_the_plan():
    colwise = {"layers.*.self_attn.k_proj": "colwise", "layers.*.self_attn.q_proj": "colwise"}
    assert parallel.local_kv_heads(_sharded(8, 4, 2, colwise)) == 2
    assert parallel.local_kv_heads(_sharded(8, 4, 1, colwise)) == 4
    assert parallel.local_kv_heads(_sharded(8, 4, 2, {})) == 4  # keys not sharded: every rank holds them all
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\) does not divide evenly by the tensor-parallel size \(2\)"):
        parallel.local_kv_heads(_sharded(6, 3, 2, colwise))


def test_a_model_split_across_devices_by_device_map_is_refused():
    model = tiny_causal_lm("llama", seed=0)
    model.hf_device_map = {"model.layers.0": "cpu", "model.layers.1": 0}
    with pytest.raises(ValueError, match="tensor parallelism"):
        specops.generate(model, [[1, 2, 3]], method="ar", max_new_tokens=2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_tp_size_is_checked(bad):
    with pytest.raises(ValueError, match="tp_size"):
        specops.generate(tiny_causal_lm("llama", seed=0), [[1, 2, 3]], method="ar", max_new_tokens=2, tp_size=bad)


# ---- the command line under torchrun --------------------------------------------------------------

def test_cli_tp_flag_needs_as_many_ranks_and_fails_under_torchrun():
    # torchrun stops the other workers as soon as one fails, so which ranks get to print is a race:
    # at least one does, and the run fails. Each rank's own message is checked below, one at a time.
    proc = _torchrun(["-m", "specops", "generate", "--tp", "3", "--method", "ar", "--prompt", "hi"])
    assert proc.returncode != 0
    assert re.search(r"specops: error \(rank [01]\): --tp 3 needs as many ranks", proc.stderr), proc.stderr[-3000:]


@pytest.mark.parametrize("rank", [0, 1])
def test_cli_tp_flag_error_prints_on_every_rank(rank):
    # The environment torchrun gives rank `rank` of 2; the check runs before any process group exists.
    proc = _run(["-m", "specops", "generate", "--tp", "3", "--method", "ar", "--prompt", "hi"],
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    assert proc.returncode != 0
    assert f"specops: error (rank {rank}): --tp 3 needs as many ranks" in proc.stderr, proc.stderr[-3000:]


@needs_smollm2
def test_cli_generate_tp2_prints_the_one_process_text_once():
    """SmolLM2-135M (9 query / 3 KV heads: attention replicated, MLP sharded over 2 ranks), tsd."""
    args = ["generate", "--method", "tsd", "--prompt", "Explain hash tables.", "--max-new-tokens", "16",
            "--dtype", "fp32"]
    tp = _torchrun(["-m", "specops", *args, "--tp", "2"])
    assert tp.returncode == 0, tp.stderr[-3000:]
    one = _run(["-m", "specops", *args])
    assert one.returncode == 0, one.stderr[-3000:]
    assert tp.stdout == one.stdout and tp.stdout.strip()
    assert tp.stderr.count("method tsd:") == 1  # the metrics print on rank 0 only
