"""Teacher-forced distillation of the draft against the target's top-k distributions.

Loss per labelled position: cross-entropy of the draft over its kept vocabulary against the target's top-k
probabilities renormalised over the kept tokens (forward KL up to a constant: what top-1 agreement needs).
Checkpoints (``last.pt``; ``best.pt`` by held-out agreement) hold the trainable weights, optimizer and
step; the batch order is a function of (seed, epoch), so a resumed run ends in the same state."""
import math
import os
import time

import torch

from .data import save_shard
from .model import trainable_state


class Progress:
    """One status line (rewritten in place on a terminal, a line every ``every`` s otherwise)."""

    def __init__(self, stream, every=10.0):
        self.stream, self.every, self._last = stream, every, 0.0
        self.tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())

    def update(self, phase, done, total, t0, extra="", force=False):
        now = time.perf_counter()
        if self.stream is None or (not force and now - self._last < (0.5 if self.tty else self.every)):
            return
        self._last = now
        rate = done / max(now - t0, 1e-9)
        eta = f"{(total - done) / rate / 60:.1f} min" if rate > 0 else "?"
        line = f"[{phase}] {done}/{total} ({100 * done / max(total, 1):.0f}%) eta {eta} {extra}"
        end = "\n" if force or not self.tty else ""
        self.stream.write(("\r" + line.ljust(100) if self.tty else line) + end)
        self.stream.flush()

    def log(self, msg):
        if self.stream is not None:
            self.stream.write(msg + "\n")
            self.stream.flush()


def flatten_rows(shards):
    """Each shard row, trimmed to its used length: (tokens, mask, idx, lp, feats or None)."""
    rows = []
    for s in shards:
        feats = s.get("feats")
        for r in range(s["tokens"].shape[0]):
            m = s["mask"][r]
            if not bool(m.any()):
                continue
            n = int(m.nonzero()[-1]) + 1
            rows.append((s["tokens"][r, :n], m[:n], s["topk_idx"][r, :n], s["topk_lp"][r, :n],
                         None if feats is None else feats[r, :n]))
    return rows


def collate(rows):
    """Rows of :func:`flatten_rows`, right-padded with zeros. Shape: -> tokens int64 [B, L], mask
    bool [B, L], idx int64 / lp fp32 [B, L, k], feats bf16 [B, L, H] or None."""
    def pad(i, dtype):
        return torch.nn.utils.rnn.pad_sequence([r[i].to(dtype) for r in rows], batch_first=True)

    feats = pad(4, torch.bfloat16) if rows[0][4] is not None else None
    return pad(0, torch.int64), pad(1, torch.bool), pad(2, torch.int64), pad(3, torch.float32), feats


def ttt_mask(M, depth, device=None):
    """The attention mask of a ``depth``-block unrolled sequence (EAGLE-3's training-time test): block d
    (1-based) position i is the depth-d token of the chain that starts after context position i-d+1; it
    sees block 1 up to i-d+1 (the target's features) and block k (2 <= k <= d) at i-(d-k) only (its
    chain's earlier tokens), as the runner's tree attention shows it. Shape: -> bool [1, 1, depth*M,
    depth*M] (True = may attend)."""
    i = torch.arange(M, device=device)
    ahead = i[None, :] - i[:, None]  # [M, M] key position - query position
    never = torch.zeros(M, M, dtype=torch.bool, device=device)
    blocks = [[ahead <= 1 - d] + [ahead == k - d if k <= d else never for k in range(2, depth + 1)]
              for d in range(1, depth + 1)]
    return torch.cat([torch.cat(row, dim=1) for row in blocks], dim=0)[None, None]


def _feature_forward(draft, tokens, mask, feats, noise, weight, depth=1):
    """EAGLE's teacher-forced step: position i reads (token i+1, target feature i), scored on the
    target's distribution at i+1 and by regression on its feature i+1. ``depth`` > 1 unrolls the
    draft's own predictions: block d's position i reads (token i+1, block d-1's output at i-1), with
    the same labels, so deeper chain tokens train too; earlier blocks' outputs carry no gradient.
    Shape: tokens, mask [B, L], feats [B, L, H] -> (draft hidden [N, H] at the scored positions of all
    blocks, their label mask [depth, B, L-1], regression loss)."""
    f_in = feats[:, :-1].float()
    if noise > 0 and draft.training:
        rms = f_in.pow(2).mean(-1, keepdim=True).sqrt()
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * noise * rms
    toks, m = tokens[:, 1:], mask[:, 1:]
    B, M = toks.shape
    if depth == 1:
        h, _ = draft.hidden(toks, f_in)  # [B, L-1, H]
        reg = torch.nn.functional.smooth_l1_loss(h[m].float(), feats[:, 1:][m].float()) * weight
        return h[m], m[None], reg
    ins = [f_in]
    pos = torch.arange(M)[None].repeat(1, depth)  # every block reuses the context's positions
    for d in range(2, depth + 1):
        with torch.no_grad():
            h_prev, _ = draft.hidden(toks.repeat(1, d - 1), torch.cat(ins, dim=1),
                                     attention_mask=ttt_mask(M, d - 1), position_ids=pos[:, :(d - 1) * M])
        last = h_prev[:, -M:].float()  # block d-1's outputs, the estimates of the next features
        ins.append(torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1))
    h, _ = draft.hidden(toks.repeat(1, depth), torch.cat(ins, dim=1), attention_mask=ttt_mask(M, depth),
                        position_ids=pos)
    h = h.reshape(B, depth, M, -1).transpose(0, 1)  # [depth, B, M, H]
    valid = torch.arange(M)[None, :] >= torch.arange(depth)[:, None]  # block d needs d-1 earlier tokens
    ms = m[None] & valid[:, None, :]  # [depth, B, M]
    tgt = feats[:, 1:].float()[None].expand(depth, -1, -1, -1)
    reg = torch.nn.functional.smooth_l1_loss(h[ms].float(), tgt[ms]) * weight
    return h[ms], ms, reg


def distill_loss(draft, batch, full2sub, amp, feature_noise=0.0, feature_weight=0.1, depth=1, per_depth=False):
    """(loss, top-1 agreement, labelled positions) of ``draft`` on a collated batch; with
    ``per_depth`` the agreement is a list, one per unrolled depth (feature drafts)."""
    tokens, mask, idx, lp, feats = batch
    reg = 0.0  # the feature draft's regression loss
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        if getattr(draft, "specops_arch", "lm") == "feature":
            h, mask, reg = _feature_forward(draft, tokens, mask, feats, feature_noise, feature_weight, depth)
            idx, lp = (t[:, 1:][None].expand(mask.shape[0], -1, -1, -1) for t in (idx, lp))
        else:
            h = draft.model(input_ids=tokens).last_hidden_state[mask]  # [N, H]
            mask, idx, lp = mask[None], idx[None], lp[None]
        logits = draft.lm_head.sub_logits(h)  # [N, Vd]
    logq = torch.log_softmax(logits.float(), dim=-1)
    idx, lp = idx[mask], lp[mask]  # [N, k]
    sub = full2sub[idx]  # [N, k], -1 where the draft cannot propose the token
    p = lp.exp() * (sub >= 0)
    z = p.sum(-1, keepdim=True)
    ok = z.squeeze(-1) > 0
    p = p / z.clamp_min(1e-12)
    ce = -(p * logq.gather(1, sub.clamp_min(0))).sum(-1)
    loss = (ce[ok].mean() if bool(ok.any()) else logq.sum() * 0.0) + reg
    hit = (draft.lm_head.keep[logq.argmax(-1)] == idx[:, 0]).float()
    if per_depth:
        counts = mask.flatten(1).sum(1).tolist()
        agree = [float(x.mean()) if x.numel() else 0.0 for x in hit.split(counts)]
        return loss, agree, counts
    return loss, float(hit.mean()), int(mask.sum())


def lr_at(step, total, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@torch.no_grad()
def evaluate_rows(draft, rows, full2sub, amp, batch_rows=16, depth=1):
    """Held-out top-1 agreement, teacher-forced, per unrolled depth (depth d: a chain's d-th token,
    from the draft's own predicted features, its d-1 predecessors right)."""
    draft.eval()
    hit, tot = [0.0] * depth, [0] * depth
    for i in range(0, len(rows), batch_rows):
        batch = collate(rows[i:i + batch_rows])
        _, agree, n = distill_loss(draft, batch, full2sub, amp, depth=depth, per_depth=True)
        for d in range(min(depth, len(agree))):
            hit[d] += agree[d] * n[d]
            tot[d] += n[d]
    return [h / max(1, t) for h, t in zip(hit, tot)]


def train(draft, train_rows, val_rows, ckpt_dir, *, steps, batch_rows, lr, warmup, seed, amp,
          ckpt_every, eval_every, max_seconds=None, progress=None, stop_after=None, feature_noise=0.0,
          feature_weight=0.1, depth=1):
    """Trains ``draft`` in place for ``steps`` optimizer steps, resuming from ``ckpt_dir/last.pt``.
    ``depth`` > 1: training-time test that many chain tokens deep; the best step has the most expected
    accepted tokens by the held-out agreements. ``stop_after``: checkpoint and stop after this many steps
    (tests interrupt a run so). Returns the state (steps, wall time, history, best agreement)."""
    os.makedirs(ckpt_dir, exist_ok=True)
    progress = progress or Progress(None)
    full2sub = torch.full((draft.config.vocab_size,), -1, dtype=torch.int64)
    full2sub[draft.lm_head.keep] = torch.arange(draft.lm_head.keep.numel())
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    state = {"step": 0, "wall": 0.0, "history": [], "best_agree": -1.0, "best_step": 0}
    last = os.path.join(ckpt_dir, "last.pt")
    if os.path.exists(last):
        ck = torch.load(last, weights_only=False)
        draft.load_state_dict(ck["model"], strict=False)
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        progress.log(f"resumed from {last} at step {state['step']}")
    per_epoch = max(1, len(train_rows) // batch_rows)
    t0, wall0, start = time.perf_counter(), state["wall"], state["step"]
    losses, agrees = [], []  # since the last evaluation

    def save(path):
        save_shard({"model": trainable_state(draft), "opt": opt.state_dict(), "state": state}, path)

    def evaluate(entry):
        """Adds the held-out agreements to the history ``entry``; keeps the best step in best.pt."""
        state["history"].append(entry)
        by_depth = evaluate_rows(draft, val_rows, full2sub, amp, depth=depth)
        # expected accepted tokens of a greedy chain: a1 + a1 a2 + ... (depth 1: the agreement)
        score = sum(math.prod(by_depth[:d + 1]) for d in range(depth))
        entry["val_agree"] = by_depth[0]
        if depth > 1:
            entry["val_agree_by_depth"] = by_depth
        if score > state.get("best_score", state["best_agree"]):
            state["best_agree"], state["best_score"], state["best_step"] = by_depth[0], score, entry["step"]
            if depth > 1:
                state["best_agree_by_depth"] = by_depth
            save(os.path.join(ckpt_dir, "best.pt"))

    if state["step"] == 0 and val_rows:  # the start is a candidate too: a fine-tune may only lose agreement
        evaluate({"step": 0, "wall_s": 0.0})
    while state["step"] < steps:
        step = state["step"]
        epoch, pos = divmod(step, per_epoch)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(len(train_rows), generator=g).tolist()
        batch = collate([train_rows[j] for j in order[pos * batch_rows:(pos + 1) * batch_rows]])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        draft.train()
        loss, agree, _ = distill_loss(draft, batch, full2sub, amp, feature_noise, feature_weight, depth)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        state.update(step=step + 1, wall=wall0 + time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        agrees.append(agree)
        done = state["step"]
        timed_out = max_seconds is not None and state["wall"] >= max_seconds
        means = {"loss": sum(losses) / len(losses), "train_agree": sum(agrees) / len(agrees)}
        if done % eval_every == 0 or done == steps or timed_out:
            entry = {"step": done, **means, "wall_s": round(state["wall"], 1)}
            if val_rows:
                evaluate(entry)
            else:
                state["history"].append(entry)
            losses, agrees = [], []
        h = {**state["history"][-1], **means} if state["history"] else means
        extra = f"loss {h['loss']:.3f} agree {h['train_agree']:.3f}"
        if "val_agree" in h:
            extra += f" val {h['val_agree']:.3f} (best {state['best_agree']:.3f})"
            if "val_agree_by_depth" in h:
                extra += " by depth " + "/".join(f"{a:.2f}" for a in h["val_agree_by_depth"])
        progress.update("train", done - start, steps - start, t0, extra, force=done == steps)
        stop = timed_out or (stop_after and done >= stop_after)
        if done % ckpt_every == 0 or done == steps or stop:
            save(last)
        if timed_out:
            progress.log(f"training stopped at the time limit ({max_seconds:.0f} s) after step {done}")
        if stop:
            break
    if not val_rows:
        save(os.path.join(ckpt_dir, "best.pt"))
        state["best_step"] = state["step"]
    return state
