"""The feature draft (EAGLE-style, ``specops.distill.feature``) behind the DraftLM interface, driven
like a plain draft LM; each block node also reads a feature row: a catch-up chain node at position
``p`` the target's final hidden state at ``p - 1`` (``target.features``, filled by the target's
``keep``; zeros at 0), any other node its parent's predicted feature (the draft's output there).

K/V computed from predicted features only approximate those from the target's, so the cache keeps
them for the current proposal only (Ouroboros' repeated drafting reuses them): ``exact[b]`` counts
the cached tokens computed from the target's features, and ``begin`` re-feeds the rest as the
catch-up chain, now with the target's features (what EAGLE does after each verification)."""
import torch

from .draft_lm import DraftLM


class FeatureDraftLM(DraftLM):
    """Shape: the target's features [B, max_len, H] are read through ``target.features``."""

    def __init__(self, model, batch_size, max_len, target, **runner_kw):
        super().__init__(model, batch_size, max_len, **runner_kw)
        if getattr(target, "features", None) is None:
            raise ValueError("a feature draft needs a target ModelRunner created with keep_features=True")
        self.target = target
        H = model.config.hidden_size
        self.exact = [0] * batch_size
        self._hid = None  # [B, T, H] the draft's predicted feature at every fed block node
        self._tail = torch.zeros(batch_size, H, dtype=next(model.parameters()).dtype, device=self.device)
        self._base = [0] * batch_size  # sequence position of block node 0
        self._chain_len = [0] * batch_size  # block nodes 0..chain_len-1 read the target's features

    def _target_rows(self, b, start, n):
        """The target's features at positions start-1 .. start+n-2 (zeros at -1; n >= 1). Shape [n, H]."""
        f = self.target.features[b]
        rows = f[max(start - 1, 0): start - 1 + n]
        return torch.cat([f.new_zeros(n - len(rows), f.shape[-1]), rows])

    def prefill(self, prompts, logits=False):
        L = max(len(p) for p in prompts)
        feats = torch.zeros(self.B, L, self.target.features.shape[-1], dtype=self.target.features.dtype,
                            device=self.device)
        for b, p in enumerate(prompts):
            feats[b, : len(p)] = self._target_rows(b, 0, len(p))
        out = super().prefill(prompts, logits, features=feats)
        self.exact = [len(p) for p in prompts]
        return out

    def begin(self, seqs, active):
        self.cached = [self.cached[b][: self.exact[b]] for b in range(self.B)]
        super().begin(seqs, active)  # through begin_chain: _base = the cached lengths, _hid = None
        self.exact = list(self._base)
        self._chain_len = [len(t) for t in self.tokens]

    def begin_chain(self, chains):
        super().begin_chain(chains)
        self._base = [len(c) for c in self.cached]
        self._chain_len = [0] * self.B
        self._hid = None

    def node_features(self, q0, parents, held):
        T, H = parents.shape[1], self._tail.shape[-1]
        feats = torch.zeros(self.B, T - q0, H, dtype=self._tail.dtype, device=self.device)
        on_device = False
        for b in range(self.B):
            n, fed = len(self.tokens[b]), self.fed[b]
            chain = min(self._chain_len[b], n)
            if q0 < chain:
                feats[b, : chain - q0] = self._target_rows(b, self._base[b] + q0, chain - q0)
            for i in range(max(q0, chain), n):
                # The parent's predicted feature; a parent fed in this same call has none yet
                # (several nodes added at once, e.g. a phrase), so the nearest fed ancestor's stands in.
                p = self.parents[b][i]
                if p is None:  # the device chose the parent (fed earlier): gathered below
                    on_device = True
                    continue
                while p >= fed:
                    p = self.parents[b][p]
                feats[b, i - q0] = self._tail[b] if p < 0 else self._hid[b, p]
        if on_device:
            at = parents[:, q0:].long().clamp(0, self._hid.shape[1] - 1)  # [B, T - q0]
            feats = torch.where(held[..., None], self._hid.gather(1, at[..., None].expand(-1, -1, H)), feats)
        return feats

    def forward(self, rows=None, extra=None):
        q0 = min(self.fed)
        computes = any(self.fed[b] < len(self.tokens[b]) for b in range(self.B))
        out = super().forward(rows, extra)
        if computes:  # rows before q0 are kept (a block only grows, so _hid holds them all)
            new = self.hidden.detach().to(self._tail.dtype)  # [B, T - q0, H]: the draft's predicted features
            self._hid = torch.cat([self._hid[:, :q0] if self._hid is not None else new[:, :0], new], 1)
        return out

    def commit_paths(self, paths, path_tokens=None):
        hid, chain = self._hid, self._chain_len
        before = [len(c) for c in self.cached]
        lens = super().commit_paths(paths, path_tokens)
        for b in range(self.B):
            if lens[b] and hid is not None:  # the kept path's last node
                self._tail[b] = hid[b, paths[b][lens[b] - 1]]
            if self.exact[b] == before[b]:  # nodes past the catch-up chain read predicted features
                self.exact[b] = before[b] + min(lens[b], chain[b])
        return lens
