"""End to end: every method x embedded target x draft x the fixed prompt set (bench/prompts.json),
greedy and sampled, batch 1 and 4 — with the HF peers measured in the same process on the same
model, dtype and prompts: plain ``generate``, assisted generation with the same draft model, and
prompt-lookup decoding.

    python bench/bench_decoding.py [--quick]      # CSV bench/results/<machine>/decoding.csv

Per (task, sampling, batch, provider) it records tokens/s (generated tokens / wall time, prefill
included, summed over the task's prompts), speedup vs autoregressive decoding of our loop measured in
the same run, mean acceptance length (tokens per target forward, bonus included), drafted tokens per
step, the draft / verify / bookkeeping time split and, for the approximate methods (GSD with merging,
MJSD), the deviation: the share of greedy tokens that differ from AR, and the target perplexity.
"""
import json
import os
import time

import torch

import specops
from specops import models

from _harness import main

OP = "decoding"
HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("smollm2-135m", "gemma3-270m")
MODEL_METHODS = ("sd", "specinfer", "tsd", "gsd", "opt-tree", "ouroboros", "mjsd")
FREE_METHODS = ("ngram", "ouroboros")
SAMPLING = {"greedy": dict(temperature=0.0), "sample": dict(temperature=0.7, top_p=0.9)}
LOSSY = ("gsd", "mjsd")


def prompts(tokenizer, quick):
    with open(os.path.join(HERE, "prompts.json")) as f:
        spec = json.load(f)
    out = {}
    for task, items in spec.items():
        if task.startswith("_"):
            continue
        ids = []
        for item in items[:1] if quick else items:
            if item["chat"] and tokenizer.chat_template:
                text = tokenizer.apply_chat_template([{"role": "user", "content": item["text"]}], tokenize=False,
                                                     add_generation_prompt=True)
            else:
                text = item["text"]
            ids.append(tokenizer(text)["input_ids"])
        out[task] = ids
    return out


def drafts_for(target):
    names = [f"{target}-int8"]
    trained = f"{target}-draft"
    try:
        models.split_name(trained)
        names.append(trained)
    except ValueError:
        pass
    return names


def _hf_generate(model, ids, new, mode, **extra):
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=mode != "greedy")
    if mode != "greedy":
        kw.update(temperature=0.7, top_p=0.9)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), **kw, **extra)
    return out.shape[1] - len(ids), time.perf_counter() - start


def run_task(rec, target_name, target, tok, draft_models, task, batch_ids, mode, batch, new, quick):
    base = dict(target=target_name, task=task, mode=mode, batch=batch, new_tokens=new)
    groups = [batch_ids[i:i + 1] for i in range(len(batch_ids))] if batch == 1 else \
        [(batch_ids * batch)[:batch]]
    configs = [("ar", None, "ar")] + [(m, None, m) for m in FREE_METHODS]  # model-free variants
    configs += [(m, d, f"{m}/{d.split('-')[-1]}") for d in draft_models for m in MODEL_METHODS]
    ar_tokens = {}
    for method, draft, provider in configs:
        stats = dict(tokens=0, time=0.0, fwd=0, draft_tokens=0, nodes=0, draft_s=0.0, verify_s=0.0, book_s=0.0,
                     mal_num=0, mal_den=0, lp=0.0, lp_n=0, diff=0, cmp=0)
        for g, ids in enumerate(groups):
            extra = {"model_free": True} if method == "ouroboros" and draft is None else {}
            out, m = specops.generate(target, ids, draft=draft_models.get(draft), method=method, max_new_tokens=new,
                                      eos_token_id=[], seed=g, **SAMPLING[mode], **extra)
            stats["tokens"] += m.num_generated_tokens
            stats["time"] += m.total_time_s
            stats["fwd"] += m.num_target_forwards
            stats["draft_tokens"] += m.num_draft_tokens
            stats["nodes"] += m.num_drafted_nodes
            stats["draft_s"] += m.draft_time_s
            stats["verify_s"] += m.verify_time_s
            stats["book_s"] += m.bookkeeping_time_s
            stats["mal_num"] += m.num_drafts + m.num_accepted_tokens
            stats["mal_den"] += m.num_drafts
            stats["lp"] += m.target_logprob_sum
            stats["lp_n"] += m.target_logprob_count
            if method == "ar":
                ar_tokens[g] = out
            elif mode == "greedy" and g in ar_tokens:
                n = min(out.shape[1], ar_tokens[g].shape[1])
                stats["diff"] += int((out[:, :n] != ar_tokens[g][:, :n]).sum())
                stats["cmp"] += out[:, :n].numel()
        tps = stats["tokens"] / stats["time"]
        rec.value(provider, base, "tokens_per_s", "tok/s", tps)
        if method == "ar":
            ar_tps = tps
        rec.value(provider, base, "speedup_vs_ar", "x", tps / ar_tps)
        steps = max(stats["mal_den"], 1)
        rec.value(provider, base, "mean_acceptance_length", "tokens", stats["mal_num"] / steps)
        rec.value(provider, base, "drafted_tokens_per_step", "tokens", stats["draft_tokens"] / steps)
        rec.value(provider, base, "drafted_nodes_per_step", "nodes", stats["nodes"] / steps)
        for part in ("draft_s", "verify_s", "book_s"):
            rec.value(provider, base, f"time_{part[:-2]}_share", "%", 100 * stats[part] / stats["time"])
        if stats["lp_n"]:
            rec.value(provider, base, "target_perplexity", "ppl", float(torch.tensor(-stats["lp"] / stats["lp_n"]).exp()))
        if stats["cmp"] and (method in LOSSY or stats["diff"]):
            rec.value(provider, base, "tokens_differing_from_ar", "%", 100 * stats["diff"] / stats["cmp"])
    if batch != 1:
        return  # the HF peers decode one sequence at a time
    peers = {"hf_generate": {}, "hf_prompt_lookup": {"prompt_lookup_num_tokens": 10}}
    for d in draft_models:
        peers[f"hf_assisted/{d.split('-')[-1]}"] = {"assistant_model": draft_models[d]}
    for provider, extra in peers.items():
        tokens = seconds = 0
        for ids in groups:
            n, t = _hf_generate(target, ids[0], new, mode, **extra)
            tokens, seconds = tokens + n, seconds + t
        rec.value(provider, base, "tokens_per_s", "tok/s", tokens / seconds)
        rec.value(provider, base, "speedup_vs_ar", "x", tokens / seconds / ar_tps)


def measure(rec, quick):
    torch.manual_seed(0)
    new = 32 if quick else 128
    for target_name in TARGETS[:1] if quick else TARGETS:
        if not models.available(target_name):
            rec.skip(target_name, dict(target=target_name), f"not installed: {models.EMBEDDED[target_name].install}")
            continue
        target, tok = models.load(target_name, "bf16")
        draft_models = {d: models.load(d)[0] for d in drafts_for(target_name)}
        for task, ids in prompts(tok, quick).items():
            for mode in ("greedy",) if quick else SAMPLING:
                for batch in (1,) if quick else (1, 4):
                    run_task(rec, target_name, target, tok, draft_models, task, ids, mode, batch, new, quick)


if __name__ == "__main__":
    main(OP, measure)
