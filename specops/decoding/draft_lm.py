"""The draft model: a :class:`~specops.engine.ModelRunner` plus the block a drafter grows, by the
draft-cache policy of docs/methods.md §KV caches (``cached[b]``: the tokens whose draft K/V are
committed). A node's token and parent are host ints (``add``) or device values (``add_device``:
never read; a device parent must be a node fed by an earlier forward); node counts are always on the
host. ``forward`` uploads the host-known part in one staged upload and scatters device values into
the block's device copy; ``commit_paths`` takes device nodes' tokens from the caller (the step's one
read brought the accepted path back), so a commit reads nothing."""
import torch

from ..engine import ModelRunner
from . import _kernels
from .sampling import greedy_tokens


class DraftLM(ModelRunner):
    def __init__(self, model, batch_size, max_len, **runner_kw):
        super().__init__(model, batch_size, max_len, **runner_kw)
        self.cached = [[] for _ in range(batch_size)]
        self.tokens = self.parents = None
        self.root = [0] * batch_size
        self._q0 = 0
        self.hidden = None  # [B, T - q0, H]: the latest forward's LM-head input (a forward with features)
        self._open()

    def prefill(self, prompts, logits=False, **kw):
        """Commits the prompts (without the pending root). ``kw``: ``features`` for a feature draft."""
        out = super().prefill(prompts, logits=logits, **kw)
        self.cached = [list(p) for p in prompts]
        return out

    def begin(self, seqs, active):
        """Opens a block per sequence: the catch-up chain ending at the pending root (``seqs[b][-1]``);
        an inactive sequence gets a one-node block, never extended."""
        keep, chains = [], []
        for b in range(self.B):
            seq, have = seqs[b], self.cached[b]
            n, lim = 0, min(len(have), len(seq) - 1)
            while n < lim and have[n] == seq[n]:
                n += 1
            keep.append(n)
            self.cached[b] = have[:n]
            chains.append(seq[n:] if active[b] else seq[-1:])
        if keep != self.host_lens:  # rows go: metadata only, checked on the host against its copy
            self.truncate(keep)
        self.begin_chain(chains)

    def begin_chain(self, chains):
        """Opens a block per sequence from explicit chains that follow the cached tokens
        (``begin``'s catch-up chains; Ouroboros' repeated draft forwards)."""
        self.tokens = [list(c) for c in chains]
        self.parents = [[-1] + list(range(len(c) - 1)) for c in chains]
        self.root = [len(c) - 1 for c in chains]
        self._open()

    def _open(self):
        self.fed = [0] * self.B
        self._logits = self._argmax = None
        self._dev_parents = None  # [B, T] int32 the block's parents on the device, grown per forward
        self._dev_tokens = None  # [B, T] the block's tokens on the device, once it has device nodes
        self._pending = []  # (tokens [N], parents [N] or None, [(b, node, entry)]) added since the latest forward

    def _row(self, node):
        """``node``'s row in the latest forward's logits."""
        if node < self._q0:
            raise IndexError("logits are kept only for the nodes computed by the latest forward()")
        return node - self._q0

    def add(self, b, token, parent):
        """A new block node below block node ``parent``; returns its index."""
        self.tokens[b].append(int(token))
        self.parents[b].append(int(parent))
        return len(self.tokens[b]) - 1

    def add_device(self, bs, parents, tokens, at=None):
        """New nodes whose tokens stay on the device (None in the host lists): node ``j`` of sequence
        ``bs[j]`` takes ``tokens[at[j]]`` (``at`` None: ``j``) below ``parents[j]`` (a host list) or
        ``parents[at[j]]`` (a device tensor). Returns the node indices. Shape: tokens int64 [N],
        parents int [N] on the runner's device (or a host list [len(bs)])."""
        at = range(len(bs)) if at is None else at
        on_device = isinstance(parents, torch.Tensor)
        nodes = []
        for j, b in enumerate(bs):
            self.tokens[b].append(None)
            self.parents[b].append(None if on_device else int(parents[j]))
            nodes.append(len(self.tokens[b]) - 1)
        self._pending.append((tokens, parents if on_device else None, list(zip(bs, nodes, at))))
        return nodes

    def forward(self, rows=None, extra=None):
        """Computes every unfed node; ``logits(b, node)`` then reads any node fed in this call.
        ``rows``: (b, node) pairs fed in this call whose logits to return; ``extra``: ints the caller
        needs on the device (both in the forward's one upload). A feature draft also gets ``hidden``,
        the computed rows' LM-head input. Shape: -> ([len(rows), V] or None, int64 [len(extra)] or None)."""
        rows, extra = rows or [], extra or []
        if all(self.fed[b] == len(self.tokens[b]) for b in range(self.B)):  # rows of the latest forward
            picked = None
            if rows:
                Tq = self._logits.shape[1]
                idx = self.stager.upload([b * Tq + self._row(n) for b, n in rows])
                picked = self._logits.reshape(self.B * Tq, -1)[idx]
            return picked, (self.stager.upload(extra) if extra else None)
        q0 = min(self.fed)
        T = max(len(t) for t in self.tokens)
        Tq = T - q0
        if any(n < q0 for _, n in rows):
            raise IndexError("logits are kept only for the nodes computed by this forward()")
        # One upload: the new columns q0..T-1 of tokens (-1 where the device holds the token) and
        # parents (-2 where the device holds it), the node counts, where each device value goes in
        # the [B, T] block and which pending entry it takes (tokens, then parents), the rows, extra.
        flat = []
        for per_seq, hole in ((self.tokens, -1), (self.parents, -2)):
            for r in per_seq:
                flat += [hole if v is None else v for v in r[q0:]] + [0] * (T - len(r))
        flat += [len(t) for t in self.tokens]
        counts = []
        for kind in (0, 1):  # 0: tokens (every pending entry), 1: parents (the entries with device parents)
            base, pos, take = 0, [], []
            for e in self._pending:
                if e[kind] is None:
                    continue
                pos += [b * T + n for b, n, _ in e[2]]
                take += [base + j for _, _, j in e[2]]
                base += e[kind].shape[0]
            counts.append(len(pos))
            flat += pos + take
        flat += [b * Tq + n - q0 for b, n in rows] + extra
        n, (k_tok, k_par) = self.B * Tq, counts
        new_tok, new_par, num_nodes, tok_at, par_at, row_at, extra_up = self.stager.upload(flat).split(
            [n, n, self.B, 2 * k_tok, 2 * k_par, len(rows), len(extra)])
        new_tok, new_par = new_tok.view(self.B, Tq), new_par.view(self.B, Tq).to(torch.int32)
        num_nodes = num_nodes.to(torch.int32)
        if k_tok or self._dev_tokens is not None:
            values = torch.cat([e[0].reshape(-1) for e in self._pending]) if k_tok else None
            self._dev_tokens, new_tok = _filled(self._dev_tokens, new_tok, tok_at, values, q0, -1)
        values = torch.cat([e[1].reshape(-1) for e in self._pending if e[1] is not None]) if k_par else None
        held = new_par == -2  # [B, Tq] nodes whose parent the device holds
        self._dev_parents, _ = _filled(self._dev_parents, new_par, par_at, values, q0, -2)
        self._pending = []
        features = self.node_features(q0, self._dev_parents, held)
        if features is None:
            self._logits = super().forward(new_tok, self._dev_parents, num_nodes, q0)
        else:
            self._logits, self.hidden = super().forward(new_tok, self._dev_parents, num_nodes, q0, features=features,
                                                        want_hidden=True)
        self._argmax, self._q0, self.fed = None, q0, [len(t) for t in self.tokens]
        picked = self._logits.reshape(self.B * Tq, -1)[row_at] if rows else None
        return picked, (extra_up if extra else None)

    def node_features(self, q0, parents, held):
        """A feature draft's input rows for nodes ``q0..`` (None: a plain LM). Shape: parents int32
        [B, T] on the device, held bool [B, T - q0] (the device chose the parent) -> [B, T - q0, H]."""

    def logits(self, b, node):
        """Shape: -> [V], the draft's next-token logits after block node ``node``."""
        return self._logits[b, self._row(node)]

    def argmax(self, b, node):
        """The draft's argmax token after block node ``node`` (fed by the latest forward). The first
        call after a forward reads every row's argmax in one host read."""
        row = self._row(node)
        if self._argmax is None:
            self._argmax = greedy_tokens(self._logits).tolist()  # [B][T - q0]
        return self._argmax[b][row]

    def commit_paths(self, paths, path_tokens=None):
        """Keeps in the cache, per sequence, the fed prefix of a root path of block nodes, closes the
        block and returns the kept counts. ``path_tokens[b]``: the tokens of ``paths[b]``'s nodes
        (needed where ``add_device`` left the token on the device)."""
        idx = []
        for b in range(self.B):
            keep = []
            for j, node in enumerate(paths[b] or []):
                if node < 0 or node >= self.fed[b]:
                    break
                parent = self.parents[b][node]  # None: the device chose it (the path follows the tree)
                if j and parent is not None and parent != keep[-1]:
                    break
                keep.append(node)
            idx.append(keep if keep and keep[0] == 0 else [])
        lens = [len(keep) for keep in idx]
        if any(lens):
            A = max(lens)
            rows = []
            for p, n in zip(idx, lens):
                start = p[-1] + 1 if p else 0  # entries past accept_lens: ignored, kept increasing
                rows += p + list(range(start, start + A - n))
            up = self.stager.upload(rows + lens).to(torch.int32)
            self.keep(up[: self.B * A].view(self.B, A), up[self.B * A:], lens, check=_kernels.CHECK)
        for b in range(self.B):
            known = self.tokens[b]
            self.cached[b] += [known[i] if known[i] is not None else path_tokens[b][j] for j, i in enumerate(idx[b])]
        self._open()
        self.tokens = self.parents = None
        return lens


def _filled(block, cols, placed, values, q0, hole):
    """The block's device copy grown to the new columns with the device values scattered in, and the
    new columns with their holes filled (a re-fed column's from ``block``). Shape: block [B, T'] or
    None, cols [B, T - q0] (``hole``: on the device), placed int64 [2k] (k flat positions in [B, T],
    then the entries of ``values`` [N] they take) -> ([B, T], [B, T - q0])."""
    B, Tq = cols.shape
    grown = cols.new_zeros(B, q0 + Tq)
    if block is not None:
        grown[:, : block.shape[1]] = block
    if values is not None:
        k = placed.shape[0] // 2
        grown.view(-1)[placed[:k]] = values[placed[k:]].to(grown.dtype)
    cols = torch.where(cols == hole, grown[:, q0:], cols)
    grown[:, q0:] = cols
    return grown, cols
