"""One :class:`~specops.engine.ModelRunner`'s compiled block forward over its own cache: the block
padded to the graph's shapes, the attention kernel chosen once for the cache, the LM head on the
block's rows. The graphs themselves (one per model, batch and layout, saved to disk) are
:mod:`.compiled`'s."""
import torch

from ..draft_models import is_feature_draft
from ..ops.tree_attention.plan import TreeAttentionPlan
from ..ops.tree_mask import build_tree_mask
from .attention import CompiledBlock
from .compiled import BLOCK, BUCKETS, MASK_WORDS, MAX_BUCKET, bucket_for, decoder_for, mask_words


class CompiledRunner:
    """The compiled block forwards of one :class:`~specops.engine.ModelRunner` over its cache."""

    def __init__(self, runner, cfg, mode):
        model, cache = runner.model, runner.cache
        self.runner = runner
        self.decoder = decoder_for(model, mode)
        self.k_store, self.v_store, self.page_table = cache.layout.k, cache.layout.v, cache.layout.page_table
        # Caches of any length share a graph: their row (page) count is a symbol. Under CUDA graphs the
        # cache tensors are static inputs (fixed addresses, kept across runners by the pooled cache);
        # CUDA-graph trees copy the small per-step inputs into the graph's own buffers.
        dim = 1 if cache.layout.is_paged else 3
        for t in cache.layout.tensors():
            if t.shape[dim] > 1:  # dynamo specialises sizes 0 and 1 anyway
                torch._dynamo.mark_dynamic(t, dim)
            if self.decoder.cudagraphs:
                torch._dynamo.mark_static_address(t)
        B, dev = runner.batch_size, runner.device
        # The kernel is chosen once, for this cache's shapes (the eager path does it per forward).
        one = torch.ones(B, dtype=torch.int32, device=dev)
        plan = TreeAttentionPlan(one, one, torch.ones(B, 1, 1, dtype=torch.int32, device=dev), q_lens=one,
                                 head_dim=cache.head_dim, num_heads=cfg.num_attention_heads,
                                 num_kv_heads=cache.num_kv_heads, dtype=cache.dtype, device=dev, check=False,
                                 page_table=self.page_table, page_size=cache.page_size)
        self.backend = plan.backend
        self.impl = None if plan.backend in ("cpp", "cuda") else plan.kernel  # None: the registered op
        self.head = model.get_output_embeddings()
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        # Whether some layer attends through a sliding window (Qwen2 keeps the field but may not use it).
        types = getattr(cfg, "layer_types", None)
        windowed = (getattr(cfg, "use_sliding_window", True) is not False
                    and (types is None or "sliding_attention" in types))
        self.window = getattr(cfg, "sliding_window", None) if windowed else None
        self.feature = is_feature_draft(model)
        self.arange = torch.arange(runner.cache.max_len + MAX_BUCKET, device=dev)
        # Packed linear weights are graph inputs the plain ones' graph lacks: a key of their own.
        self.packed = any(getattr(m, "specops_packed", None) is not None for m in model.modules())
        self.compile_time_s = 0.0

    def takes(self, Tq, longest):
        """Whether a block of ``Tq`` query rows reaching ``longest`` rows runs compiled."""
        return Tq <= MAX_BUCKET and not (self.window and longest > self.window)

    def forward(self, tokens, mask, depth, block_lens, q_start, features=None):
        """Shape: tokens int [B, Tq], mask int32 [B, Tq, W], depth int32 [B, Tq], block_lens int32 [B],
        features [B, Tq, H] (a feature model's) or None -> logits [B, Tq, V] (model dtype)."""
        hidden = self.hidden(tokens, mask, depth, block_lens, q_start, features)  # [B, Tb, H]
        return self.logits(hidden[:, :tokens.shape[1]])

    def logits(self, hidden):
        """The LM head (and the model's final soft cap). Shape: [B, T, H] -> [B, T, V] (model dtype), or
        [B, T, Vd] over the runner's ``vocab_keep`` (a subset head's rows, not scattered)."""
        logits = self.head(hidden) if self.runner.vocab_keep is None else self.head.sub_logits(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def hidden(self, tokens, mask, depth, block_lens, q_start, features=None):
        """The block's final hidden states (the LM head's input), the arguments as :meth:`forward`'s.
        Shape: -> [B, Tb, H] (model dtype), Tb >= Tq: rows from Tq on are padding."""
        pad = torch.nn.functional.pad
        Tq = tokens.shape[1]
        # One graph for every row count (a symbol); CUDA graphs capture static shapes, so there
        # blocks are padded to buckets. A one-row block is padded to two until a saved graph runs it.
        dynamic = not self.decoder.cudagraphs
        Wb = max(MASK_WORDS, mask_words(32 * mask.shape[2]))  # wider only for a partial block past 64 rows
        key = (BLOCK if dynamic else bucket_for(Tq), Wb, self.runner.batch_size, self.runner.kv_layout,
               self.runner.batch_invariant, self.packed)
        Tb = bucket_for(Tq) if not dynamic else Tq if Tq > 1 or self.decoder.runs_one_row(key) else 2
        lens = self.runner.lens
        base = lens.to(torch.int64)[:, None]  # [B, 1]
        ids = pad(tokens.to(torch.int64), (0, Tb - Tq))
        positions = base + pad(depth.to(torch.int64), (0, Tb - Tq))  # padding rows: position lens
        rows = base + self.arange[q_start:q_start + Tb]  # [B, Tb] cache rows of the new K/V
        m = pad(mask, (0, Wb - mask.shape[2], 0, Tb - Tq))[:, None]  # [B, 1, Tb, Wb]; padding rows see nothing
        feats = None
        if self.feature:
            if features is None:
                raise ValueError("a feature draft's forward needs its input rows: pass features= "
                                 "(shape [B, T, hidden])")
            feats = pad(features, (0, 0, 0, Tb - features.shape[1]))
        # the row dims, dynamic where a call traces (the bounds are the trace's; a saved graph is not
        # guarded by them)
        marks = (((ids, 1), (positions, 1), (rows, 1), (m, 2)) + (((feats, 1),) if feats is not None else ())
                 if dynamic else ())
        block = CompiledBlock(self.impl, lens, block_lens, block_lens - q_start, m, rows, self.k_store, self.v_store,
                              self.page_table, self.runner.batch_invariant)
        hidden, secs = self.decoder(key, ids, positions, m, block, feats, marks=marks)
        self.compile_time_s += secs
        return hidden

    def warmup(self, sizes=None):
        """Compiles the buckets of ``sizes`` (default all) with a scratch block at the current
        lengths (its rows stay uncommitted). Returns the seconds spent compiling."""
        before = self.compile_time_s
        B, dev = self.runner.batch_size, self.runner.device
        sizes = sorted({bucket_for(min(int(T), MAX_BUCKET)) for T in (sizes or BUCKETS)})
        if not self.decoder.cudagraphs:  # one graph for blocks of any size, traced with two rows
            sizes = [2]
        H = self.runner.model.config.hidden_size
        for Tb in sizes:
            parents = (torch.arange(Tb, dtype=torch.int32, device=dev) - 1).expand(B, Tb).contiguous()
            feats = torch.zeros(B, Tb, H, dtype=self.k_store.dtype, device=dev) if self.feature else None
            mask, depth = build_tree_mask(parents, None, check=False)
            self.runner.forward_mask(torch.zeros(B, Tb, dtype=torch.int64, device=dev), mask, depth,
                                     torch.full((B,), Tb, dtype=torch.int32, device=dev), features=feats)
        return self.compile_time_s - before
