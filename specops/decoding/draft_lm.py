"""A draft model with its own runner and cache, driven through growing draft blocks.

Draft-cache policy (docs/methods.md §KV caches), one mechanism for every drafter:

* ``cached[b]`` mirrors the tokens whose draft K/V are committed. Before drafting, ``begin`` keeps
  the longest prefix of ``cached[b]`` that agrees with the sequence (a metadata-only truncate) and
  opens a block whose first nodes are the catch-up chain: every sequence token not yet cached,
  ending with the pending root ``r`` (so the draft always computes a fresh distribution after ``r``).
  SD's "feed ``x_gamma`` and the bonus" (the draft never ran on ``x_gamma``) and OPT-Tree's
  "re-feed the accepted tokens" are both this catch-up chain.
* Drafters add tree nodes below the chain (``add``) and ``forward`` computes every node not yet
  fed, in one ``forward_block`` call with ``q_start`` at the first unfed node.
* ``commit_paths`` compacts a root path of fed block nodes into the cache (their K/V were computed
  under exactly that context). Anything else is dropped by the next ``begin``.
"""
import torch

from . import _kernels
from .runner import block_logits, commit_paths, make_runner, pad_batch


class DraftLM:
    def __init__(self, model, batch_size, max_len, **runner_kw):
        self.model = model
        self.runner = make_runner(model, batch_size, max_len, **runner_kw)
        self.B = batch_size
        self.max_len = max_len
        self.cached = [[] for _ in range(batch_size)]
        self.tokens = self.parents = None
        self.fed = [0] * batch_size
        self.root = [0] * batch_size
        self.forwards = 0
        self.host_lens = [0] * batch_size  # runner.lens as a host list (kept without reading it back)
        self._logits = self._argmax = None
        self._q0 = 0

    def prefill(self, prompts):
        """Commits the prompts (without the pending root). prompts: list of token lists."""
        ids, lens = pad_batch(prompts)
        dev = self.runner.lens.device
        if getattr(self.runner, "prefill_last_only", False):
            self.runner.prefill(ids.to(dev), lens.to(dev), last_only=True)  # logits unused: skip the [L, V] head
        else:
            self.runner.prefill(ids.to(dev), lens.to(dev))
        self.cached = [list(p) for p in prompts]
        self.host_lens = [len(p) for p in prompts]

    # ---- blocks ------------------------------------------------------------------------------

    def begin(self, seqs, active):
        """Opens a block per sequence: the catch-up chain ending at the pending root.

        ``seqs[b]``: the full sequence, whose last token is the pending root. Inactive sequences
        get a one-node block and are never extended."""
        keep = []
        self.tokens, self.parents = [], []
        for b in range(self.B):
            seq, have = seqs[b], self.cached[b]
            n = 0
            lim = min(len(have), len(seq) - 1)
            while n < lim and have[n] == seq[n]:
                n += 1
            keep.append(n)
            self.cached[b] = have[:n]
            chain = seq[n:] if active[b] else seq[-1:]
            self.tokens.append(list(chain))
            self.parents.append([-1] + list(range(len(chain) - 1)))
            self.root[b] = len(chain) - 1
        if keep != self.host_lens:  # rows go: metadata only, checked on the host against its copy
            self.runner.truncate(torch.tensor(keep, dtype=torch.int32, device=self.runner.lens.device), keep)
            self.host_lens = keep
        self.fed = [0] * self.B
        self._logits = self._argmax = None

    def begin_chain(self, chains):
        """Opens a block per sequence from explicit chains that follow the cached tokens
        (Ouroboros' repeated draft forwards)."""
        self.tokens = [list(c) for c in chains]
        self.parents = [[-1] + list(range(len(c) - 1)) for c in chains]
        self.root = [len(c) - 1 for c in chains]
        self.fed = [0] * self.B
        self._logits = self._argmax = None

    def add(self, b, token, parent):
        """A new block node below block node ``parent``; returns its index."""
        self.tokens[b].append(int(token))
        self.parents[b].append(int(parent))
        return len(self.tokens[b]) - 1

    def size(self, b):
        return len(self.tokens[b])

    def forward(self):
        """Computes every unfed node. Afterwards ``logits(b, node)`` reads any node fed in this call."""
        q0 = min(self.fed)
        if all(self.fed[b] == len(self.tokens[b]) for b in range(self.B)):
            return
        T = max(len(t) for t in self.tokens)
        tokens = torch.zeros(self.B, T, dtype=torch.int64)
        parents = torch.zeros(self.B, T, dtype=torch.int32)
        for b in range(self.B):
            n = len(self.tokens[b])
            tokens[b, :n] = torch.tensor(self.tokens[b])
            parents[b, :n] = torch.tensor(self.parents[b], dtype=torch.int32)
        num_nodes = torch.tensor([len(t) for t in self.tokens], dtype=torch.int32)
        dev = self.runner.lens.device
        self._logits = block_logits(self.runner, tokens.to(dev), parents.to(dev), num_nodes.to(dev), q0)
        self._argmax = None
        self._q0 = q0
        self.fed = [len(t) for t in self.tokens]
        self.forwards += 1

    @property
    def first_row_node(self):
        """A node every sequence has a logits row for after ``forward`` (rows may be padding)."""
        return self._q0

    def logits(self, b, node):
        """Shape: -> fp32 [V], the draft's next-token logits after block node ``node``."""
        if node < self._q0:
            raise IndexError("logits are kept only for the nodes computed by the latest forward()")
        return self._logits[b, node - self._q0]

    def argmax(self, b, node):
        """The draft's argmax token after block node ``node`` (fed by the latest forward). The first
        call after a forward reads every row's argmax in one host read."""
        if node < self._q0:
            raise IndexError("logits are kept only for the nodes computed by the latest forward()")
        if self._argmax is None:
            self._argmax = self._logits.argmax(-1).tolist()  # [B][T - q0]
        return self._argmax[b][node - self._q0]

    def logits_rows(self, pairs):
        """Shape: list of (b, node) -> fp32 [len(pairs), V]."""
        if not pairs:
            return None
        if any(n < self._q0 for _, n in pairs):
            raise IndexError("logits are kept only for the nodes computed by the latest forward()")
        bs = torch.tensor([b for b, _ in pairs])
        rows = torch.tensor([n - self._q0 for _, n in pairs])
        return self._logits[bs, rows]

    def commit_paths(self, paths):
        """Compacts, per sequence, the fed prefix of a block root path (list of block nodes starting
        at 0) into the cache. The block is closed afterwards."""
        idx, lens = [], []
        for b in range(self.B):
            path = paths[b] if paths[b] is not None else []
            keep = []
            for j, node in enumerate(path):
                if node < 0 or node >= self.fed[b] or (j and self.parents[b][node] != keep[-1]):
                    break
                keep.append(node)
            if not keep or keep[0] != 0:
                keep = []
            idx.append(keep)
            lens.append(len(keep))
        commit_paths(self.runner, idx, check=_kernels.CHECK)
        self.host_lens = [n + len(i) for n, i in zip(self.host_lens, idx)]
        for b in range(self.B):
            self.cached[b].extend(self.tokens[b][i] for i in idx[b])
        self.tokens = self.parents = None
        self._logits = self._argmax = None
        return lens
