"""THROWAWAY TEST-ONLY SHIM — delete once specops.integrations.transformers.SpecModel lands.

A stand-in with the SpecModel interface built from plain HF pieces: one DynamicCache per sequence
and a 4D float mask per block. Slow and simple; it exists only so the decoding loop can run end to
end before the real runner is merged.
"""
import torch
from transformers import DynamicCache


class ShimRunner:
    def __init__(self, model, batch_size, max_len):
        self.model = model
        self.B = batch_size
        self.max_len = max_len
        self.lens = torch.zeros(batch_size, dtype=torch.int32)
        self.caches = [DynamicCache(config=model.config) for _ in range(batch_size)]
        self._dtype = next(model.parameters()).dtype
        if self._dtype not in (torch.float32, torch.bfloat16, torch.float16):
            self._dtype = torch.float32

    def _len(self, b):
        return self.caches[b].get_seq_length()

    def _crop(self, b, n):
        cur = self._len(b)
        if cur > n:
            self.caches[b].crop(n - cur)
        elif cur < n:
            raise RuntimeError(f"shim: cache of sequence {b} holds {cur} rows, {n} needed")

    def prefill(self, input_ids, lens):
        B, L = input_ids.shape
        out = None
        for b in range(B):
            n = int(lens[b])
            self.caches[b] = DynamicCache(config=self.model.config)
            logits = self.model(input_ids[b:b + 1, :n], past_key_values=self.caches[b], use_cache=True).logits
            if out is None:
                out = torch.zeros(B, L, logits.shape[-1])
            out[b, :n] = logits[0].float()
        self.lens = lens.to(torch.int32).clone()
        return out

    def forward_block(self, tokens, parents, num_nodes=None, *, q_start=0):
        q0 = q_start or 0
        B, T = parents.shape
        tokens = torch.cat([torch.zeros(B, q0, dtype=tokens.dtype), tokens], 1)
        nn = [T] * B if num_nodes is None else [int(x) for x in num_nodes]
        out = None
        for b in range(B):
            n = nn[b]
            if q0 >= n:
                continue
            L = int(self.lens[b])
            self._crop(b, L + q0)
            par = [int(x) for x in parents[b, :n]]
            depth = [0] * n
            anc = [{0}] + [None] * (n - 1)
            for i in range(1, n):
                depth[i] = depth[par[i]] + 1
                anc[i] = anc[par[i]] | {i}
            rows = range(q0, n)
            mask = torch.full((1, 1, n - q0, L + n), torch.finfo(self._dtype).min, dtype=self._dtype)
            mask[..., :L] = 0
            for r, i in enumerate(rows):
                for j in anc[i]:
                    mask[0, 0, r, L + j] = 0
            pos = torch.tensor([[L + depth[i] for i in rows]])
            logits = self.model(tokens[b:b + 1, q0:n], position_ids=pos, attention_mask=mask,
                                past_key_values=self.caches[b], use_cache=True).logits
            if out is None:
                out = torch.zeros(B, T - q0, logits.shape[-1])
            out[b, : n - q0] = logits[0].float()
        if out is None:
            V = self.model.get_output_embeddings().weight.shape[0]
            out = torch.zeros(B, T - q0, V)
        return out

    def compact(self, accept_idx, accept_lens):
        for b in range(self.B):
            a = int(accept_lens[b])
            if a == 0:
                continue
            L = int(self.lens[b])
            keep = torch.cat([torch.arange(L), L + accept_idx[b, :a].long()])
            for layer in self.caches[b].layers:
                layer.keys = layer.keys.index_select(-2, keep)
                layer.values = layer.values.index_select(-2, keep)
            self.lens[b] = L + a

    def truncate(self, new_lens):
        self.lens = new_lens.to(torch.int32).clone()

    def commit(self, counts):
        self.lens = self.lens + counts.to(torch.int32)
