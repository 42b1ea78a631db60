"""What the plans' shape reconciliation (issue #34) costs per ``run``: the same plan run with it
(``run``) and without it (the pre-reconciliation ``run``: no comparison after the first call),
interleaved in one process so that machine noise hits both alike.

Shapes: decode steps where a run is cheapest and the comparison weighs most: TreeAttentionPlan
(cpp backend) with B = 1, Tq in {1, 4}, Hq = 8, Hkv = 2, D = 64, S = 512 (contiguous and paged
pages of 16 rows); KVCompactPlan (cpp) with L = 4, B = 1, Hkv = 2, D = 64, S = 512, 2 accepted
rows. Reports the median microseconds per run of each and their ratio.

    python bench/plan_reconcile.py [--reps 2000] [--rounds 7]
"""
import argparse
import statistics
import time

import torch

import specops
from specops import KVCompactPlan, TreeAttentionPlan
from specops.testing import to_pages


class _UncheckedTree(TreeAttentionPlan):
    def run(self, q, k, v):  # the run of before issue #34: nothing compared after the first call
        if self._first:
            self._first_run(q, k, v)
        return self.kernel(q, k, v, *self._table, self.prefix_lens, self.block_lens, self.mask, self.q_lens,
                           self.sm_scale, self._num_splits, self._workspace, self.invariant)


class _UncheckedCompact(KVCompactPlan):
    def run(self, k, v):
        if self._first:
            self._first_run(k, v)
        if not self._noop:
            self._impl(k, v, *self._table, self.lens, self.accept_idx, self.accept_lens)


def _tree(Tq, paged):
    B, Hq, Hkv, D, S, P = 1, 8, 2, 64, 512, 400
    q = torch.randn(B, Tq, Hq, D)
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    prefix, block = torch.tensor([P], dtype=torch.int32), torch.tensor([Tq], dtype=torch.int32)
    mask = torch.full((B, Tq, 1), -1, dtype=torch.int32)
    kw = dict(head_dim=D, num_heads=Hq, num_kv_heads=Hkv, dtype=torch.float32, backend="cpp")
    if paged:
        kp, table = to_pages(k, 16, generator=torch.Generator().manual_seed(0))
        vp, _ = to_pages(v, 16, generator=torch.Generator().manual_seed(0))
        kw.update(page_table=table, page_size=16, num_pages=kp.shape[0])
        k, v = kp, vp
    else:
        kw.update(max_len=S)
    plans = [cls(prefix, block, mask, **kw) for cls in (TreeAttentionPlan, _UncheckedTree)]
    return plans, (q, k, v)


def _compact():
    L, B, Hkv, D, S = 4, 1, 2, 64, 512
    k, v = torch.randn(L, B, Hkv, S, D), torch.randn(L, B, Hkv, S, D)
    lens, idx = torch.tensor([300], dtype=torch.int32), torch.tensor([[0, 3]], dtype=torch.int32)
    acc = torch.tensor([2], dtype=torch.int32)
    kw = dict(num_layers=L, num_kv_heads=Hkv, head_dim=D, max_len=S, dtype=torch.float32, backend="cpp")
    return [cls(lens, idx, acc, **kw) for cls in (KVCompactPlan, _UncheckedCompact)], (k, v)


def _time(plan, args, reps):
    run = plan.run
    t = time.perf_counter()
    for _ in range(reps):
        run(*args)
    return (time.perf_counter() - t) / reps * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = {f"tree_attention Tq={Tq}{' paged' if paged else ''}": _tree(Tq, paged)
             for Tq in (1, 4) for paged in (False, True)}
    cases["kv_compact L=4"] = _compact()
    print(f"specops {specops.__version__ if hasattr(specops, '__version__') else ''} torch {torch.__version__}, "
          f"1 thread, {a.reps} runs x {a.rounds} rounds, interleaved")
    print(f"{'case':<32} {'checked us':>10} {'unchecked us':>12} {'ratio':>7}")
    for name, ((checked, unchecked), args) in cases.items():
        for p in (checked, unchecked):
            _time(p, args, 50)  # first runs and warm-up
        c, u = [], []
        for _ in range(a.rounds):
            c.append(_time(checked, args, a.reps))
            u.append(_time(unchecked, args, a.reps))
        mc, mu = statistics.median(c), statistics.median(u)
        print(f"{name:<32} {mc:10.2f} {mu:12.2f} {mc / mu:7.3f}")


if __name__ == "__main__":
    main()
