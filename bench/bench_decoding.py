"""End to end: every method x embedded target x draft x the fixed prompt set (bench/prompts.json),
with the HF peers measured in the same process on the same model, dtype and prompts: plain
``generate``, assisted generation with the same draft model, and prompt-lookup decoding.

    python bench/bench_decoding.py --profile final     # the official run (quiet machine, ~20 min)
    python bench/bench_decoding.py --profile final --tasks code_edit --prompts 1 --modes greedy   # cost probe
    python bench/bench_decoding.py --quick             # smoke: 1 task, 1 prompt, 8 new tokens
    python bench/bench_decoding.py --profile quick --tasks code_edit --new-tokens 8 --methods ar,sd
    python -m bench --only decoding [--quick]          # the same through the suite runner
    python bench/bench_decoding.py --profile final --targets smollm2-135m --questions FILE --per-category 2
    python bench/bench_decoding.py --compare-engines --threads 2 --engine-python vllm_cpu=PY  # docs/engines.md
    python bench/bench_decoding.py --tp 2 --methods ar,ngram,tsd   # TP 2 under torchrun vs one process (docs/scaling.md)

``--questions FILE`` replaces the fixed prompts with a JSON-lines question file in the field's
format (``question_id``, ``category``, ``turns``; bench/questions.py validates it and names the line
and field of a bad one): the categories become the tasks (``--tasks`` picks some), the first turn
of each question is the prompt through the target's chat template, ``--per-category N`` keeps the
first N questions of each category (default all) in every mode, and no batch-4 group runs. Rows
carry ``questions=<file name>`` in their params; the CSV keeps the other tasks' rows (so a questions
run adds to the prompt set's results). Every run ends with a per-task table (per category here):
each provider's tok/s, speedup vs AR, mean acceptance length and vs the best HF peer.

Output: ``bench/results/<machine>/decoding.csv`` (long format, one row per metric). A case is
(target, dtype, task, mode, batch, new_tokens, prompts); a provider is ``ar``, a model-free method
(``ngram``, ``ouroboros`` = model_free=True), ``<method>/<draft kind>`` (e.g. ``sd/int8``,
``gsd/draft``), ``tsd@<n>/<kind>`` (the equal-node-budget TSD beside OPT-Tree's ``n``, root
excluded), or an HF peer (``hf_generate``, ``hf_prompt_lookup``, ``hf_assisted/<kind>``). Metrics
per (case, provider): ``tokens_per_s`` (generated tokens / wall time, prefill included, summed over
the prompts), ``speedup_vs_ar`` (our AR, same run), ``speedup_vs_best_hf`` and ``best_hf_peer``
(unit = the peer's name, value = its tok/s; the best of the HF peers on the same case),
``speedup_vs_hf_assisted`` (the same draft), ``mean_acceptance_length``, ``drafted_tokens_per_step``
(proposed for verification, root excluded), ``drafted_nodes_per_step`` (draft-side nodes, root
included: GSD's "drafted tokens"), ``draft_acceptance_rate``, ``time_{prefill,draft,verify,
bookkeeping}_share``, ``draft_forward_ms`` / ``target_forward_ms`` (per forward; the AR row's target
forward is the plain one-token step), ``target_perplexity``, ``perplexity_vs_ar`` and, greedy only,
``tokens_differing_from_ar`` (for lossless methods this is the bf16 numerical noise floor; for GSD
with merging under sampling and MJSD it is the deviation). HF rows carry ``tokens_per_s``,
``speedup_vs_ar`` and their perplexity. Adaptive speculation (on by default, docs/methods.md
§Adaptive speculation) adds ``mean_budget`` (the controller's mean budget over its speculative
steps) and ``ar_step_share`` (its AR steps' share of the target forwards); ``--no-adaptive`` runs
every method with its fixed budget instead (the rows carry ``adaptive=false`` in their params, and
such a run replaces the same cases' rows like any rerun).

The ``final`` plan (PROFILES below) and its cost. 64 new tokens (EOS ignored, so every run emits
exactly 64), each config warmed up once per target on a 4-token run first.
* smollm2-135m (bf16), the primary pair: 5 tasks x 2 prompts greedy, 5 x 1 sampled (T 0.7, top-p 0.9)
  at batch 1; batch 4 greedy on one mixed batch (the first prompt of code_edit, prose, math, chat:
  a server's batch is heterogeneous, and repeated prompts would feed Ouroboros' shared phrase pool
  the answer). Providers: ar, ngram, ouroboros (model-free), the 7 model methods x {int8, draft},
  tsd@10/int8 (OPT-Tree's budget), hf_generate, hf_prompt_lookup, hf_assisted/{int8, draft}.
* gemma3-270m (bf16): 5 tasks x 1 prompt, greedy, batch 1; the same providers with the int8 draft
  only (no trained draft ships for it; the bench records a skip row if `-draft` is absent).
Measured cost (2-core EPYC shared with two other jobs, torch on 1 thread, 64 new tokens, one prompt
of code_edit; ``--profile final --tasks code_edit --prompts 1 --modes greedy --threads 1``): all 22
smollm2 providers 113 s, all 14 gemma providers 93 s, both targets' loading + warm-up + the
machine-limit probe 160 s; the batch-4 group costs about 2x a batch-1 case (measured at 4 tokens).
Plan: smollm2 15 cases x 113 s = 28 min, gemma 5 x 93 s = 8 min, batch 4 ~4 min, overhead ~3 min:
~42 min on that loaded machine. Our AR ran at 12 tok/s there against 25.7 tok/s on 2 quiet threads
(session 1's CI), so the official run should take ~20 min on a quiet machine (less once the loop
gets faster).

Fairness rules: Ouroboros' cross-call phrase pool is cleared before every (case, provider) so that
history reuse only spans the task's own earlier prompts, never an earlier run of the same prompt;
sampling uses one seed per prompt for every provider; the HF peers decode batch 4 as one padded
``generate`` call (plain) or prompt by prompt (assisted / prompt lookup: batch-1 only in
transformers), the time summed.
"""
import argparse
import csv
import dataclasses
import json
import os
import sys
import time

import torch

import specops
from specops import models

import questions as qfile
from _harness import FIELDS, RESULTS, Recorder

OP = "decoding"
HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_METHODS = ("sd", "specinfer", "tsd", "gsd", "opt-tree", "ouroboros", "mjsd")
FREE_METHODS = ("ngram", "ouroboros")
SAMPLING = {"greedy": dict(temperature=0.0), "sample": dict(temperature=0.7, top_p=0.9)}
LOSSY = ("gsd", "mjsd")
TASKS = ("code", "code_edit", "prose", "math", "chat")
MIXED = ("code_edit", "prose", "math", "chat")  # the batch-4 group: first prompt of each
HF_PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted")
ADAPTIVE = {"on": True}  # --no-adaptive turns it off for every specops provider
COMPILE = {"on": False}  # --compile: every specops provider's forwards compiled (the warm-up compiles)
ROUNDS = {"n": 1}  # --rounds: each case's specops providers run this many times, interleaved


@dataclasses.dataclass
class TargetPlan:
    target: str
    drafts: tuple = ("int8", "draft")
    tasks: tuple = TASKS
    prompts: int = 2  # per task
    modes: tuple = ("greedy", "sample")  # at batch 1
    sample_prompts: int = 1  # per task in the sampled runs (bench/paper_claims.py checks greedy claims)
    batch4_modes: tuple = ()  # batch 4 runs one mixed group in these modes
    equal_budget: bool = True  # tsd@<opt-tree n> beside opt-tree, first draft only


PROFILES = {
    "final": dict(new_tokens=64, plans=(
        TargetPlan("smollm2-135m", batch4_modes=("greedy",)),
        TargetPlan("gemma3-270m", drafts=("int8", "draft"), prompts=1, modes=("greedy",)))),
    "quick": dict(new_tokens=8, plans=(
        TargetPlan("smollm2-135m", drafts=("int8",), tasks=("code_edit",), prompts=1, modes=("greedy",)),)),
}


def prompts(tokenizer, per_task=None, tasks=None):
    """task -> list of token-id lists (chat items through the tokenizer's chat template)."""
    with open(os.path.join(HERE, "prompts.json")) as f:
        spec = json.load(f)
    out = {}
    for task, items in spec.items():
        if task.startswith("_") or (tasks is not None and task not in tasks):
            continue
        ids = []
        for item in items[:per_task]:
            text = item["text"]
            if item["chat"] and tokenizer.chat_template:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
            ids.append(tokenizer(text, add_special_tokens=not item["chat"])["input_ids"])
        out[task] = ids
    return out


def drafts_for(target, kinds):
    """({name: loaded model} of the available ``<target>-<kind>`` drafts, {name: why not} of the others)."""
    loaded, missing = {}, {}
    for kind in kinds:
        name = f"{target}-{kind}"
        try:
            loaded[name] = models.load_any(name)[0]
        except (ValueError, ImportError, OSError) as err:
            missing[name] = str(err).split(";")[0]
    return loaded, missing


def _kind(draft):
    return draft.rsplit("-", 1)[-1]


class _Pools:
    """Ouroboros' phrase pool persists across generate() calls (history reuse). Each provider keeps
    its own pool across the prompts of a round, and starts every round empty: a second run of the
    same prompt would otherwise find its own answer in the pool, and one provider another's."""

    def __init__(self):
        try:
            from specops.decoding import phrase_pool
            self.shared = phrase_pool._SHARED
        except (ImportError, AttributeError):
            self.shared = None
        self.saved = {}

    def params(self):
        return {} if self.shared is not None else {"reuse_pool": False}

    def enter(self, provider, fresh):
        if self.shared is not None:
            self.shared.clear()
            self.shared.update({} if fresh else self.saved.get(provider, {}))

    def leave(self, provider):
        if self.shared is not None:
            self.saved[provider] = dict(self.shared)


def configs(drafts, equal_budget):
    """(provider, method, draft name, method params) in run order; AR first (the baseline)."""
    out = [("ar", "ar", None, {})]
    out += [(m, m, None, {"model_free": True} if m == "ouroboros" else {}) for m in FREE_METHODS]
    for d in drafts:
        out += [(f"{m}/{_kind(d)}", m, d, {}) for m in MODEL_METHODS]
    if equal_budget and drafts:
        from specops.decoding.methods.opt_tree import OptTreeDrafter
        # OPT-Tree verifies n nodes + the root. The fixed tree beside it: TSD's top-k tree with k = 2
        # and no pruning, filled breadth-first to exactly the same n nodes (OPT-Tree's "Binary" baseline).
        n = OptTreeDrafter.PARAMS["n"]
        out.append((f"tsd@{n}/{_kind(drafts[0])}", "tsd", drafts[0],
                    {"k": 2, "theta_prob": 0.0, "theta_sib": 0.0, "max_nodes": n + 1, "max_tree_nodes": n + 1}))
    return out


class Acc:
    """Sums a provider's Metrics over a case's prompt groups."""
    FIELDS = ("num_generated_tokens", "total_time_s", "num_target_forwards", "num_draft_forwards", "num_drafts",
              "num_draft_tokens", "num_accepted_tokens", "num_drafted_nodes", "prefill_time_s", "draft_time_s",
              "verify_time_s", "bookkeeping_time_s", "target_logprob_sum", "target_logprob_count",
              "num_ar_steps", "num_budget_steps", "budget_sum")

    def __init__(self):
        self.v = dict.fromkeys(self.FIELDS, 0)
        self.diff = self.cmp = self.runs = self.first = 0

    def add(self, m):
        self.runs += 1
        self.first += m.batch_size  # the prefill emits each sequence's first token
        for k in self.FIELDS:
            self.v[k] += getattr(m, k)

    def merge(self, other):  # another round of the same provider and case
        self.runs, self.first = self.runs + other.runs, self.first + other.first
        for k in self.FIELDS:
            self.v[k] += other.v[k]

    def compare(self, out, ref):
        n = min(out.shape[1], ref.shape[1])
        self.diff += int((out[:, :n] != ref[:, :n]).sum())
        self.cmp += out[:, :n].numel()

    @property
    def tps(self):
        return self.v["num_generated_tokens"] / self.v["total_time_s"]

    @property
    def decode_tps(self):  # the tokens after the first over the time after the prefill (time to first token)
        n = self.v["num_generated_tokens"] - self.first
        return n / max(self.v["total_time_s"] - self.v["prefill_time_s"], 1e-9)

    @property
    def ppl(self):
        n = self.v["target_logprob_count"]
        return float(torch.tensor(-self.v["target_logprob_sum"] / n).exp()) if n else None


def _hf_generate(model, groups, new, mode, pad_id, **extra):
    """HF generate over the groups; batch > 1 pads on the left. Returns (tokens, seconds, ppl)."""
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=mode != "greedy", pad_token_id=pad_id,
              output_scores=False, return_dict_in_generate=False)
    if mode != "greedy":
        kw.update(temperature=0.7, top_p=0.9, top_k=0)
    tokens = seconds = 0.0
    lp_sum = lp_n = 0.0
    for g, ids in enumerate(groups):
        width = max(len(p) for p in ids)
        inp = torch.tensor([[pad_id] * (width - len(p)) + p for p in ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
        torch.manual_seed(g)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(inp, attention_mask=mask, **kw, **extra)
        seconds += time.perf_counter() - start
        tokens += (out.shape[1] - width) * len(ids)
        with torch.inference_mode():  # the target's log-likelihood of what HF emitted (not timed)
            full = torch.cat([mask, torch.ones(len(ids), out.shape[1] - width, dtype=mask.dtype)], 1)
            pos = (full.cumsum(-1) - 1).clamp(min=0)  # left padding: positions as generate() used them
            logits = model(out, attention_mask=full, position_ids=pos).logits[:, width - 1:-1].float()
            lp = logits.log_softmax(-1).gather(-1, out[:, width:, None])
        lp_sum, lp_n = lp_sum + float(lp.sum()), lp_n + lp.numel()
    return tokens, seconds, float(torch.tensor(-lp_sum / lp_n).exp())


def _run_specops(target, groups, new, mode, method, draft, params, warm=False, seed0=0):
    """``seed0``: the seed of ``groups[0]`` (group g is seeded seed0 + g, the same wherever it runs)."""
    acc, outs = Acc(), []
    for g, ids in enumerate(groups):
        out, m = specops.generate(target, ids, draft=draft, method=method, max_new_tokens=new, eos_token_id=[],
                                  seed=seed0 + g, adaptive=ADAPTIVE["on"], logprobs=True, compile=COMPILE["on"],
                                  **SAMPLING[mode], **params)
        acc.add(m)
        outs.append(out)
        if warm:
            break
    return acc, outs


def record(rec, provider, base, acc, ar, method):
    """The per-(case, provider) metrics of a specops run (``ar``: the AR Acc of the same case)."""
    v, steps = acc.v, max(acc.v["num_drafts"], 1)
    val = lambda metric, unit, x: rec.value(provider, base, metric, unit, x, n=acc.runs)  # noqa: E731
    val("tokens_per_s", "tok/s", acc.tps)
    val("speedup_vs_ar", "x", acc.tps / ar.tps)
    val("decode_tokens_per_s", "tok/s", acc.decode_tps)
    val("decode_speedup_vs_ar", "x", acc.decode_tps / ar.decode_tps)
    val("mean_acceptance_length", "tokens", 1 + v["num_accepted_tokens"] / steps)
    val("drafted_tokens_per_step", "tokens", v["num_draft_tokens"] / steps)
    val("drafted_nodes_per_step", "nodes", v["num_drafted_nodes"] / steps)
    if v["num_draft_tokens"]:
        val("draft_acceptance_rate", "%", 100 * v["num_accepted_tokens"] / v["num_draft_tokens"])
    for part in ("prefill", "draft", "verify", "bookkeeping"):
        val(f"time_{part}_share", "%", 100 * v[f"{part}_time_s"] / v["total_time_s"])
    if v["num_draft_forwards"]:
        val("draft_forward_ms", "ms", 1e3 * v["draft_time_s"] / v["num_draft_forwards"])
    if v["num_target_forwards"]:
        val("target_forward_ms", "ms", 1e3 * v["verify_time_s"] / v["num_target_forwards"])
    if acc.ppl is not None:
        val("target_perplexity", "ppl", acc.ppl)
        if ar.ppl:
            val("perplexity_vs_ar", "x", acc.ppl / ar.ppl)
    if acc.cmp and method != "ar":
        val("tokens_differing_from_ar", "%", 100 * acc.diff / acc.cmp)
    if v["num_budget_steps"]:
        val("mean_budget", "levels", v["budget_sum"] / v["num_budget_steps"])
    if v["num_budget_steps"] or v["num_ar_steps"]:
        val("ar_step_share", "%", 100 * v["num_ar_steps"] / max(v["num_target_forwards"], 1))


def run_case(rec, plan, target, tok, drafts, hf_drafts, task, groups, mode, batch, new, timings, tag=None):
    """Every provider on one case; ``groups``: lists of prompts decoded together (batch each);
    ``tag``: extra case params (``questions=<file>``)."""
    base = dict(target=plan.target, dtype="bf16", task=task, mode=mode, batch=batch, new_tokens=new,
                prompts=sum(len(g) for g in groups), **(tag or {}), **({} if ADAPTIVE["on"] else {"adaptive": False}))
    ar = None
    results, accs, first_outs = {}, {}, {}
    todo = [c for c in configs(drafts, plan.equal_budget) if rec.wants(c[0]) or c[0] == "ar"]
    # Interleaved per prompt group: every provider runs group g before any runs group g + 1, in an
    # order rotated by one for each (round, group). A provider's sum then spans the same stretch of
    # the run as every other's, so a drift in the machine's speed (a VM can change pace within a
    # minute) falls on all of them alike rather than on whichever ran during it.
    turn, pools = 0, _Pools()
    for r in range(ROUNDS["n"]):
        for g, grp in enumerate(groups):
            order = todo[turn % len(todo):] + todo[:turn % len(todo)]
            turn += 1
            for provider, method, draft, params in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                pools.enter(provider, fresh=g == 0)
                acc, outs = _run_specops(target, [grp], new, mode, method, draft,
                                         dict(params, **pools.params()) if method == "ouroboros" else params, seed0=g)
                pools.leave(provider)
                _progress(timings, base, provider, t0, quiet=True)
                if provider in accs:
                    accs[provider].merge(acc)
                else:
                    accs[provider], first_outs[provider] = acc, []
                if r == 0:
                    first_outs[provider] += outs
    for provider, *_ in todo:
        print(f"# {base['target']} {base['task']} {base['mode']} b{base['batch']} {provider}: "
              f"{timings.get(provider, 0.0):.1f} s so far", flush=True)
    for provider, method, _, _ in todo:  # AR first: the others' ratios need it
        acc = accs[provider]
        if method == "ar":
            ar, ar_outs = acc, first_outs[provider]
        elif mode == "greedy":
            for out, ref in zip(first_outs[provider], ar_outs):
                acc.compare(out, ref)
        results[provider] = (acc, method)
        record(rec, provider, base, acc, ar, method)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    peers = {}
    for provider, extra in _peer_kwargs(hf_drafts):
        if not rec.wants(provider):
            continue
        t0 = time.perf_counter()
        try:
            if batch > 1 and provider != "hf_generate":  # batch-1-only in transformers: one by one
                parts = [_hf_generate(target, [[p] for p in grp], new, mode, pad, **extra) for grp in groups]
                n, s = sum(p[0] for p in parts), sum(p[1] for p in parts)
                ppl = sum(p[2] for p in parts) / len(parts)
            else:
                n, s, ppl = _hf_generate(target, groups, new, mode, pad, **extra)
        except Exception as err:  # noqa: BLE001  (a peer that cannot run is recorded, not fatal)
            rec.skip(provider, base, f"{type(err).__name__}: {str(err)[:120]}")
            continue
        _progress(timings, base, provider, t0)
        peers[provider] = n / s
        rec.value(provider, base, "tokens_per_s", "tok/s", n / s, n=len(groups))
        rec.value(provider, base, "speedup_vs_ar", "x", n / s / ar.tps, n=len(groups))
        rec.value(provider, base, "target_perplexity", "ppl", ppl, n=len(groups))
    if peers:
        best = max(peers, key=peers.get)
        for provider, (acc, method) in results.items():
            rec.value(provider, base, "speedup_vs_best_hf", "x", acc.tps / peers[best])
            rec.value(provider, base, "best_hf_peer", best, peers[best])
            same = f"hf_assisted/{provider.rsplit('/', 1)[-1]}"
            if "/" in provider and same in peers:
                rec.value(provider, base, "speedup_vs_hf_assisted", "x", acc.tps / peers[same])


def _progress(timings, base, provider, t0, quiet=False):
    secs = time.perf_counter() - t0
    timings[provider] = timings.get(provider, 0.0) + secs
    if quiet:
        return
    print(f"# {base['target']} {base['task']} {base['mode']} b{base['batch']} {provider}: {secs:.1f} s", flush=True)


def _peer_kwargs(hf_drafts):
    yield "hf_generate", {}
    yield "hf_prompt_lookup", {"prompt_lookup_num_tokens": 10}
    for name, model in hf_drafts.items():
        yield f"hf_assisted/{_kind(name)}", {"assistant_model": model}


def run_target(rec, plan, new, timings, tasks=None, on_case=None, questions=None):
    """``questions``: (file name, {category: [Question]}) from bench/questions.py, replacing the
    prompt set (``plan.prompts`` / ``tasks`` are not applied to it: questions.load did that)."""
    ok, why = models.available(plan.target)
    if not ok:
        rec.skip(plan.target, dict(target=plan.target), f"not installed: {why}")
        return
    target, tok = models.load(plan.target, "bf16")
    loaded, missing = drafts_for(plan.target, plan.drafts)
    for name, why in missing.items():
        rec.skip(f"*/{_kind(name)}", dict(target=plan.target), why)
    # specops.generate gets the draft by name (it resolves whatever the name stands for); HF's
    # assisted generation gets the loaded model when it is a plain HF causal LM.
    drafts = list(loaded)
    hf_drafts = {d: m for d, m in loaded.items() if hasattr(m, "generate")}
    for d in set(loaded) - set(hf_drafts):
        rec.skip(f"hf_assisted/{_kind(d)}", dict(target=plan.target), f"{d} is not an HF causal LM (no .generate)")
    tag = {"questions": questions[0]} if questions else None
    all_ids = qfile.encode(tok, questions[1]) if questions else prompts(tok, plan.prompts, tasks or plan.tasks)
    first = next(iter(all_ids.values()))[:1]
    # Warm-up: first calls pay lazy imports, allocator growth and one-off kernel setup.
    for provider, method, draft, params in configs(drafts, plan.equal_budget):
        if rec.wants(provider) or provider == "ar":
            _run_specops(target, [first], 4, "greedy", method, draft, params, warm=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for provider, extra in _peer_kwargs(hf_drafts):
        if not rec.wants(provider):
            continue
        try:
            _hf_generate(target, [first], 4, "greedy", pad, **extra)
        except Exception:  # noqa: BLE001  (recorded as a skip in run_case)
            pass
    for task, ids in all_ids.items():
        for mode in plan.modes:
            chosen = ids[:plan.sample_prompts] if mode == "sample" else ids
            run_case(rec, plan, target, tok, drafts, hf_drafts, task, [[p] for p in chosen], mode, 1, new, timings,
                     tag)
            if on_case:
                on_case()
    mixed = [all_ids[t][0] for t in MIXED if t in all_ids]
    if len(mixed) == len(MIXED) and not questions:
        for mode in plan.batch4_modes:
            run_case(rec, plan, target, tok, drafts, hf_drafts, "mixed", [mixed], mode, len(mixed), new, timings)
            if on_case:
                on_case()


def measure(rec, quick, profile=None, tasks=None, new_tokens=None, targets=None, overrides=None, on_case=None,
            questions=None):
    """``python -m bench`` entry: the ``quick`` profile with --quick, else ``final``. ``on_case`` is
    called after every finished case (the CLI writes the CSV there, so a crash keeps what ran);
    ``questions``: see run_target."""
    torch.manual_seed(0)
    spec = PROFILES[profile or ("quick" if quick else "final")]
    new = new_tokens or spec["new_tokens"]
    timings = {}
    start = time.perf_counter()
    for plan in spec["plans"]:
        if targets is None or plan.target in targets:
            run_target(rec, dataclasses.replace(plan, **(overrides or {})), new, timings, tasks, on_case, questions)
    total = time.perf_counter() - start
    print(f"# decoding: {total:.0f} s in all; seconds per provider: "
          + ", ".join(f"{p} {s:.1f}" for p, s in sorted(timings.items(), key=lambda kv: -kv[1])), flush=True)
    return timings


def main(argv=None):
    parser = argparse.ArgumentParser(description="end-to-end decoding benchmark")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None)
    parser.add_argument("--quick", action="store_true", help="= --profile quick")
    parser.add_argument("--tasks", default=None, help=f"comma-separated subset of {TASKS} (of the categories with --questions)")
    parser.add_argument("--targets", default=None, help="comma-separated subset of the profile's targets")
    parser.add_argument("--methods", default=None, help="comma-separated providers (ar always runs)")
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per task (default: the profile's)")
    parser.add_argument("--modes", default=None, help="comma-separated subset of greedy,sample (batch 1)")
    parser.add_argument("--out", default=None, help="directory for decoding.csv (default bench/results/<machine>)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--questions", default=None, metavar="FILE",
                        help="JSON-lines questions (question_id, category, turns) instead of bench/prompts.json; "
                             "categories become the tasks")
    parser.add_argument("--compile", action="store_true",
                        help="specops providers with compiled forwards (generate(compile=True); compiled in the warm-up)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each case's specops providers this many times, interleaved (a machine's speed drifts)")
    parser.add_argument("--no-adaptive", action="store_true",
                        help="every specops method with its fixed budget (default: adaptive speculation)")
    parser.add_argument("--per-category", type=int, default=None, metavar="N",
                        help="with --questions: the first N questions of each category (default all)")
    parser.add_argument("--compare-engines", action="store_true",
                        help="specops against peer engines and the bandwidth limit (bench/engines/compare.py)")
    parser.add_argument("--engine-python", action="append", metavar="PEER=PYTHON",
                        help="with --compare-engines: a peer's interpreter (vllm_cpu=..., llama_cpp=...)")
    parser.add_argument("--llama-convert", default=None, metavar="PATH",
                        help="with --compare-engines: llama.cpp's convert_hf_to_gguf.py, to write the bf16 GGUF "
                             "llama_cpp/plain reads (once; kept in the specops cache)")
    parser.add_argument("--tp", type=int, default=None, metavar="N",
                        help="tensor parallelism over N ranks (torchrun) against one process (bench/decoding_tp.py)")
    args = parser.parse_args(argv)
    if args.tp:
        import decoding_tp
        decoding_tp.run(args.tp, threads=args.threads, new_tokens=args.new_tokens or 48,
                        **({"methods": args.methods} if args.methods else {}))
        return 0
    if args.compare_engines:
        from engines import compare
        return compare.main(args)
    tasks = args.tasks.split(",") if args.tasks else None
    overrides = {k: v for k, v in (("prompts", args.prompts), ("modes", tuple(args.modes.split(",")) if args.modes
                                                                   else None)) if v is not None}
    questions = None
    if args.questions:  # validated before anything is measured or written
        if args.prompts is not None:
            parser.error("--prompts does not apply to --questions; use --per-category N")
        try:
            questions = (os.path.basename(args.questions), qfile.load(args.questions, tasks, args.per_category))
        except (OSError, ValueError) as err:
            parser.error(f"--questions: {err}")
        tasks = list(questions[1])  # only these categories' earlier rows are replaced in the CSV
        # every question in both modes; one batch-1 case per (category, mode)
        overrides.update(prompts=None, sample_prompts=None, batch4_modes=())
    elif args.per_category is not None:
        parser.error("--per-category needs --questions")
    if args.threads:
        torch.set_num_threads(args.threads)
    ADAPTIVE["on"] = not args.no_adaptive
    COMPILE["on"] = args.compile
    ROUNDS["n"] = args.rounds
    profile = args.profile or ("quick" if args.quick else "final")
    providers = args.methods.split(",") if args.methods else None
    rec = Recorder(OP, "cpu", profile == "quick", providers)
    targets = args.targets.split(",") if args.targets else None
    out_dir = args.out or os.path.join(RESULTS, rec.info["machine"])
    kept = _other_targets_rows(os.path.join(out_dir, f"{OP}.csv"), targets, tasks,
                               args.modes.split(",") if args.modes else None, questions and questions[0])

    def flush():
        return write_merged(rec, out_dir, kept)

    measure(rec, profile == "quick", profile, tasks, args.new_tokens, targets, overrides, on_case=flush,
            questions=questions)
    path = flush()
    print(qfile.table(rec.rows))
    print(f"# wrote {path}" + (f" (kept {len(kept)} rows of cases not rerun)" if kept else ""))
    return rec


def _other_targets_rows(path, targets, tasks=None, modes=None, questions=None):
    """With ``--targets`` / ``--tasks`` / ``--modes``, the existing CSV's rows of the cases not rerun
    (so partial runs add up to one file; each case's ratios still come from one process); a full
    run replaces the file. A case belongs to the prompt set or to one ``questions`` file: a
    category named like a prompt task replaces only its own file's rows."""
    if (targets, tasks, modes) == (None, None, None) or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))

    def rerun(p):
        return ((targets is None or p.get("target") in targets) and (tasks is None or p.get("task") in tasks)
                and p.get("questions") == questions
                and (modes is None or p.get("batch") != 1 or p.get("mode") in modes))
    return [r for r in rows if r["provider"] != "machine" and not rerun(json.loads(r["params"] or "{}"))]


def write_merged(rec, out_dir, kept):
    """Writes this run's rows plus ``kept`` to ``out_dir/decoding.csv`` (atomically: a crash mid-
    write leaves the previous file)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{OP}.csv")
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rec.rows + kept)
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    main()
    sys.exit(0)
