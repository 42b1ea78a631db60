"""Distillation data: rows of tokens with the target's top-k next-token log-probs, in shards.

Two kinds of shard, interleaved by a fixed plan (a run's data is a function of its arguments): ``text``,
teacher-forced rows of the offline corpus (corpus.py), every position labelled; ``gen``, the target's
answers to corpus.make_prompts in one batched ``generate``, labelled by the logits it produced (no second
pass) at the generated positions only: the distribution the draft is judged on.

``shard_NNNNN.pt`` (written to a temp name and renamed: a killed run resumes at the first missing shard):

    tokens   int32 [R, L]      right-padded rows
    mask     bool  [R, L]      position i carries the distribution of token i+1
    topk_idx int32 [R, L, k]   the target's k most likely next tokens
    topk_lp  fp16  [R, L, k]   their log-probs (normalised over the full vocabulary)
    feats    bf16  [R, L, H]   (feature drafts only) the target's LM-head input at each position"""
import contextlib
import os
import random

import torch

from . import corpus


def shard_plan(num_shards, gen_frac):
    """Kinds of shards 0..num_shards-1: ``gen_frac`` of them "gen", spread evenly."""
    return ["gen" if int((i + 1) * gen_frac + 1e-9) > int(i * gen_frac + 1e-9) else "text" for i in range(num_shards)]


def shard_path(data_dir, i):
    return os.path.join(data_dir, f"shard_{i:05d}.pt")


def topk_logprobs(logits, k):
    """Shape: logits [..., V] -> (idx int32 [..., k], logprob fp16 [..., k])."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    val, idx = lp.topk(k, dim=-1)
    return idx.to(torch.int32), val.to(torch.float16)


class TextRows:
    """The corpus as deterministic rows of ``row_len`` tokens, mixing the sources round-robin."""

    def __init__(self, tokenizer, pools, row_len, seed):
        self.tok, self.row_len, rng = tokenizer, row_len, random.Random(seed)
        self.pools = [(name, list(items)) for name, items in pools]
        for _, items in self.pools:
            rng.shuffle(items)
        self.cursor = [0] * len(self.pools)  # per pool: the items read so far
        self._buffers = [[] for _ in self.pools]
        self.taken = 0  # rows

    def _fill(self, p):
        items = self.pools[p][1]
        while len(self._buffers[p]) < self.row_len and self.cursor[p] < len(items):
            _, text = items[self.cursor[p]]
            self.cursor[p] += 1
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            self._buffers[p].extend(ids + ([self.tok.eos_token_id] if self.tok.eos_token_id is not None else []))
        if len(self._buffers[p]) < self.row_len:
            return None
        row, self._buffers[p] = self._buffers[p][: self.row_len], self._buffers[p][self.row_len:]
        return row

    def take(self, n):
        """The next ``n`` rows (sources in turn; an exhausted source is skipped)."""
        out, p, dead = [], self.taken % max(1, len(self.pools)), 0
        while len(out) < n and dead < len(self.pools):
            if (row := self._fill(p)) is not None:
                out.append((self.pools[p][0], row))
            dead = 0 if row is not None else dead + 1  # sources in a row that had nothing left
            p = (p + 1) % len(self.pools)
        self.taken += len(out)
        return out


@contextlib.contextmanager
def head_inputs(model):
    """``with head_inputs(m) as got: m(ids)``: ``got[-1]`` is the LM head's input [B, T, H]."""
    got = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: got.append(args[0]))
    try:
        yield got
    finally:
        handle.remove()


@torch.no_grad()
def label_text_rows(target, rows, k, features=False):
    """The shard of teacher-forced labels (``features``: and final hidden states) of equal-length rows."""
    ids = torch.tensor([r for _, r in rows], dtype=torch.int64)
    R, L = ids.shape
    idx = torch.empty(R, L, k, dtype=torch.int32)
    lp = torch.empty(R, L, k, dtype=torch.float16)
    feats = torch.empty(R, L, target.config.hidden_size, dtype=torch.bfloat16) if features else None
    with head_inputs(target) as got:
        for r in range(R):  # one row at a time keeps the fp32 [L, V] log-softmax small
            idx[r], lp[r] = topk_logprobs(target(ids[r: r + 1]).logits[0], k)
            if features:
                feats[r] = got[-1][0].to(torch.bfloat16)
            got.clear()
    out = {"tokens": ids.to(torch.int32), "mask": torch.ones(R, L, dtype=torch.bool), "topk_idx": idx,
           "topk_lp": lp, "kind": "text", "sources": [s for s, _ in rows]}
    return {**out, "feats": feats} if features else out


@torch.no_grad()
def add_features(target, shard):
    """Adds ``feats`` by one target pass per row (for generated shards: generate keeps no hidden states)."""
    tokens, mask = shard["tokens"], shard["mask"]
    R, L = tokens.shape
    feats = torch.zeros(R, L, target.config.hidden_size, dtype=torch.bfloat16)
    with head_inputs(target) as got:
        for r in range(R):
            if not bool(mask[r].any()):
                continue
            n = int(mask[r].nonzero()[-1]) + 1
            target(tokens[r: r + 1, :n].long())
            feats[r, :n] = got.pop()[0].to(torch.bfloat16)
    shard["feats"] = feats
    return shard


@torch.no_grad()
def label_generations(target, tokenizer, prompts, k, max_new_tokens, temperature, seed):
    """The shard of the target's answers to ``prompts`` (corpus.make_prompts dicts), labelled by its
    own logits at each generated step."""
    texts = [corpus.prompt_text(tokenizer, p["text"], p["chat"]) for p in prompts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False,
                    truncation=True, max_length=384)
    eos = tokenizer.eos_token_id
    kwargs = dict(max_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    torch.manual_seed(seed)
    out = target.generate(**enc, **kwargs)
    P = enc["input_ids"].shape[1]
    rows, ns = [], []
    for b in range(len(prompts)):
        g = out.sequences[b, P:].tolist()
        ns.append(g.index(eos) + 1 if eos in g else len(g))
        rows.append(enc["input_ids"][b][enc["attention_mask"][b].bool()].tolist() + g[:ns[-1]])
    R, L = len(rows), max(len(r) for r in rows)
    tokens = torch.full((R, L), kwargs["pad_token_id"], dtype=torch.int32)
    mask = torch.zeros(R, L, dtype=torch.bool)
    idx = torch.zeros(R, L, k, dtype=torch.int32)
    lp = torch.zeros(R, L, k, dtype=torch.float16)
    steps = torch.stack(out.logits, dim=1)  # [B, G, V]
    for b, (row, n) in enumerate(zip(rows, ns)):
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        # generate's step s saw the row up to position plen+s-1 and produced token plen+s (plen: prompt)
        span = slice(len(row) - n - 1, len(row) - 1)
        mask[b, span] = True
        idx[b, span], lp[b, span] = topk_logprobs(steps[b, :n], k)
    return {"tokens": tokens, "mask": mask, "topk_idx": idx, "topk_lp": lp, "kind": "gen",
            "sources": [p["category"] for p in prompts], "temperature": temperature}


def save_shard(shard, path):
    tmp = path + ".tmp"
    torch.save(shard, tmp)
    os.replace(tmp, path)


def load_shards(data_dir, num_shards):
    shards = []
    for i in range(num_shards):
        path = shard_path(data_dir, i)
        if not os.path.exists(path):
            raise FileNotFoundError(f"missing distillation shard {path}; run the collection phase first")
        shards.append(torch.load(path, weights_only=False))
    return shards


def rank_vocab(shards, vocab_size, draft_vocab, always=(), within=None):
    """The ``draft_vocab`` token ids the draft may propose, ascending: ``always``, then the most
    teacher probability mass, then corpus frequency; ``within`` (int64 [n] or None): only from these
    ids (cutting an exported draft's vocabulary). Shape: -> int64 [min(draft_vocab, candidates)]."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    freq = torch.zeros(vocab_size, dtype=torch.float64)
    for s in shards:
        m = s["mask"]
        idx = s["topk_idx"][m].long().reshape(-1)
        mass.index_add_(0, idx, s["topk_lp"][m].float().exp().reshape(-1).double())
        freq.index_add_(0, s["tokens"].long().reshape(-1), torch.ones(s["tokens"].numel(), dtype=torch.float64))
    score = mass * 1e6 + freq  # teacher mass first; corpus frequency breaks ties among the rest
    if within is not None:
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[within] = True
        score = score.masked_fill(~allowed, float("-inf"))
    for t in always:
        if t is not None and 0 <= t < vocab_size:
            score[t] = float("inf")
    return score.topk(min(draft_vocab, int((score > float("-inf")).sum()))).indices.sort().values


def coverage(shards, keep):
    """Fraction of labelled positions whose teacher top-1 token is in ``keep``."""
    top1 = torch.cat([s["topk_idx"][..., 0][s["mask"]].long() for s in shards])
    return int(torch.isin(top1, keep).sum()) / max(1, top1.numel())
