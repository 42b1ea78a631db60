"""One model runner for target and draft (``specops.decoding.draft_lm.DraftLM`` subclasses it), and
:class:`Stager`, the only path from host lists to the device inside a decode step (docs/methods.md,
"Drafts are device tensors"). The loop drives a :class:`ModelRunner` on device tensors: ``prefill``
(commits the prompts), ``forward`` (a growing tree block after the committed rows), ``keep``."""
import functools
import inspect

import torch

from ..ops import checks
from ..ops.tree_mask import build_tree_mask
from ..parallel import text_config
from . import compiled as _compiled
from . import linear as _linear
from .attention import BLOCK_KW, Block, causal_mask, use_specops_attention
from .cache import PagedKVCache, StaticKVCache
from .compiled_forward import CompiledRunner

KV_LAYOUTS = ("contiguous", "paged")
LINEARS = ("auto", "specops", "torch")


class Stager:
    """Uploads host int lists as int64 device tensors, one non-blocking copy per call: ``upload(values)``
    list of n ints -> int64 [n] on ``device``. A ring of slots, each guarded by a CUDA event, lets the
    host refill one slot while an earlier copy is in flight."""

    SLOTS = 4

    def __init__(self, device, capacity=256):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._slots = [self._buffer(capacity) for _ in range(self.SLOTS)]
        self._events = [None] * self.SLOTS
        self._next = 0
        self.uploads = 0  # staged copies made (a counter for tests and benchmarks)

    def _buffer(self, n):
        host = torch.empty(n, dtype=torch.int64, pin_memory=self._cuda)
        return host, host.numpy()  # the NumPy view: writes reach the buffer, no tensor built

    def upload(self, values):
        i = self._next
        self._next = (i + 1) % self.SLOTS
        n = len(values)
        if self._events[i] is not None:
            self._events[i].synchronize()  # only waits when the device is a whole ring behind
        if self._slots[i][0].numel() < n:
            self._slots[i] = self._buffer(max(n, 2 * self._slots[i][0].numel()))
        host, view = self._slots[i]
        view[:n] = values
        out = torch.empty(n, dtype=torch.int64, device=self.device)
        out.copy_(host[:n], non_blocking=True)
        if self._cuda:
            if self._events[i] is None:
                self._events[i] = torch.cuda.Event()
            self._events[i].record()
        self.uploads += 1
        return out


class ModelRunner:
    """A model, its KV cache and its committed lengths, driven by device tensors.

    ``lens`` int32 [B] (device): the committed rows; ``host_lens``: the cache's host mirror, kept fresh
    from the counts the caller has (the step's packed read), so no call of a decode step reads the
    device. A block stays uncommitted until ``keep`` (the accepted path) or the cache's ``commit``.

    ``kv_layout``: "contiguous" (:class:`StaticKVCache`) or "paged" (:class:`PagedKVCache` of
    ``page_size`` rows, a power of two); ``cache_dtype`` (default the model's). ``compile``: blocks of
    up to 64 rows run one compiled graph, and prompts prefill through it in chunks of 64 rows
    (``compile_mode``: torch.compile's; docs/compile.md).
    ``linear``: which ``nn.Linear`` calls go through :func:`specops.linear` until :meth:`close`:
    "auto" (a bf16/fp16 CPU model's), "specops" (all) or "torch" (none) (docs/batch_invariance.md, "In
    the engine"). ``batch_invariant``: True, False or "auto", a row's logits with the bits of the
    one-row AR step (docs/batch_invariance.md §Exact speculation).

    Features are data: ``forward(..., want_hidden=True)`` also returns the LM head's input of the
    block's rows; a feature (EAGLE-style) model takes its input rows as ``features=``. With
    ``keep_features``, ``features`` [B, max_len, H] (model dtype) holds the LM head's input at every
    committed position ``p`` (which gave token ``p + 1``'s logits), filled by ``prefill`` and ``keep``;
    rows from ``lens[b]`` on are unspecified. A hook on the final norm (else a pre-hook on the LM head)
    captures both, in this runner's own calls only.

    ``head_subset``: where the LM head scores a subset of the vocabulary (a draft's
    :class:`~specops.draft_models.SubsetLMHead`), logits cover those tokens only: column ``j`` is token
    ``vocab_keep[j]`` (int64 [Vd], ascending), and the scatter into the full vocabulary is skipped, along
    with the caller's work on the ``-inf`` columns. ``vocab_keep`` is None otherwise (full-vocabulary logits)."""

    def __init__(self, model, batch_size, max_len, *, keep_features=False, cache_dtype=None,
                 kv_layout="contiguous", page_size=16, compile=False, compile_mode="default", linear="auto",
                 batch_invariant=False, head_subset=False):
        if not isinstance(head_subset, bool):
            raise TypeError(f"head_subset must be a bool, got {head_subset!r}")
        if linear not in LINEARS:
            raise ValueError(f"linear must be one of {LINEARS}, got {linear!r}")
        if not (isinstance(batch_invariant, bool) or batch_invariant == "auto"):
            raise ValueError(f"batch_invariant must be True, False or 'auto', got {batch_invariant!r}")
        if batch_invariant == "auto":  # where it costs nothing: a bf16/fp16 CPU model's plain linears
            batch_invariant = (linear != "torch" and _linear.eligible(model)
                               and _linear.invariant_unavailable(model) is None)
        if batch_invariant:
            if linear == "torch":
                raise ValueError("batch_invariant=True needs every linear through specops.linear: linear must be "
                                 "'auto' or 'specops', got 'torch'")
            why = _linear.invariant_unavailable(model)
            if why is not None:
                raise ValueError(f"batch_invariant=True is not available for this model: {why}")
            linear = "specops"
        self.batch_invariant = batch_invariant
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be a bool, got {compile!r}")
        max_len = checks.integer("max_len", max_len, 1)
        # A compiled block's padding rows (a one-row block padded to two; CUDA graphs' buckets) write
        # K/V past the valid rows: the cache keeps 64 spare rows, never committed nor attended.
        rows = max_len + (_compiled.MAX_BUCKET if compile else 0)
        cls, paging = StaticKVCache, {}
        if kv_layout == "paged":
            page_size = checks.power_of_two("page_size", checks.integer("page_size", page_size, 1))
            cls, paging = PagedKVCache, {"page_size": page_size}
        make = functools.partial(cls.for_model, model, batch_size, dtype=cache_dtype, **paging)
        if compile:  # a free cache of an earlier runner of the model when it is large enough
            self.cache = _compiled.decoder_for(model, compile_mode).cache_for(
                self, make, rows, (batch_size, kv_layout, page_size, cache_dtype))
        else:
            self.cache = make(rows)
        self.B, self.max_len, self.kv_layout = batch_size, max_len, kv_layout
        self.model = use_specops_attention(model).eval()
        cfg = text_config(model)
        self.vocab_size = cfg.vocab_size
        head = model.get_output_embeddings()
        self.vocab_keep = head.keep if head_subset and hasattr(head, "sub_logits") else None
        self.device = self.cache.device
        try:
            self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            self._keeps_logits = False
        # specops.linear reads each weight once per block and streams one row faster than torch's GEMM
        # (specops/engine/linear.py). Before the compiled runner: its graphs see the routed linears.
        use = linear == "specops" or (linear == "auto" and _linear.eligible(model))
        self._undo_linear = _linear.use_specops_linear(model) if use else None
        self.compiled = CompiledRunner(self, cfg, compile_mode) if compile else None
        self.stager = Stager(self.device)
        self.forwards = 0
        self.keep_features, self.features = bool(keep_features), None
        self._hidden = None  # [B, T, H]: LM-head input of the latest forward
        self._capturing = False  # the hook records only our own forwards (a draft may share the model)
        self._hook = None
        if self.keep_features:
            self._install_hook("keep_features")
            # One spare row past max_len: ``keep`` sends the padding entries of an accepted path there
            # instead of filtering them (a filter would read back a count).
            self._features_buf = torch.zeros(batch_size, max_len + 1, cfg.hidden_size,
                                             dtype=next(model.parameters()).dtype, device=self.device)
            self.features = self._features_buf[:, :max_len]

    @property
    def lens(self):
        """The committed lengths, int32 [B] (device)."""
        return self.cache.lens

    @property
    def host_lens(self):
        """The committed lengths as a list: the cache's host mirror (see the class)."""
        return list(self.cache.host_lens())

    @property
    def batch_size(self):
        return self.B

    # ---- compiled forwards -----------------------------------------------------------------------
    @property
    def compile_time_s(self):
        """Seconds this runner's forwards spent compiling (tracing, code generation or loading a saved
        graph); 0.0 when every graph it used was compiled already."""
        return 0.0 if self.compiled is None else self.compiled.compile_time_s

    def warmup(self, sizes=None):
        """Compiles (or loads) the graph for blocks of ``sizes`` query rows (under CUDA graphs one per
        bucket, default all) before timed work; returns the seconds spent. Call before ``prefill``."""
        return 0.0 if self.compiled is None else self.compiled.warmup(sizes)

    # ---- features --------------------------------------------------------------------------------
    def _install_hook(self, why):
        model = self.model
        if model.get_output_embeddings() is None:
            raise ValueError(f"{why} needs a model with an output embedding (LM head)")
        norm = getattr(model.get_decoder() if hasattr(model, "get_decoder") else None, "norm", None)
        self._all_rows = not isinstance(norm, torch.nn.Module)  # the head must see every row
        if self._all_rows:
            self._hook = model.get_output_embeddings().register_forward_pre_hook(self._capture)
        else:
            self._hook = norm.register_forward_hook(self._capture)

    def _capture(self, module, args, output=None):
        """The LM head's forward pre-hook (its input) or the final norm's forward hook (its output)."""
        if self._capturing:
            self._hidden = args[0] if output is None else output

    def close(self):
        """Removes the feature hook and restores the model's linear layers (the model outlives the runner)."""
        if self._undo_linear is not None:
            self._undo_linear()
            self._undo_linear = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _captured(self, fn, *args, want_hidden=False, **kw):
        if want_hidden and self._hook is None:
            self._install_hook("want_hidden")
        self._capturing = self.keep_features or want_hidden
        try:
            return fn(*args, **kw)
        finally:
            self._capturing = False

    # ---- the loop's calls ------------------------------------------------------------------------
    def prefill(self, prompts, logits=True, *, features=None):
        """Commits the prompts (lists of token ids). Shape: features [B, max len, H] or None (a feature
        model's input rows) -> logits [B, V] after each prompt's last token (model dtype; the LM head
        runs on those rows only), or None when ``logits`` is False."""
        ids, lens = (t.to(self.device) for t in pad_batch(prompts))
        all_rows = self.keep_features and self._all_rows  # a hook on the LM head must see every row
        out = self._captured(self.prefill_padded, ids, lens, last_only=not all_rows, features=features)
        if all_rows:
            out = out[torch.arange(self.B, device=out.device), lens.long() - 1]
        if self.keep_features:
            L = ids.shape[1]  # (a compiled block's hidden may hold padding rows past L)
            self.features[:, :L] = self._hidden[:, :L].to(self.features.dtype)
            self._hidden = None
        return out if logits else None

    def forward(self, tokens, parents, num_nodes=None, q_start=0, *, features=None, want_hidden=False):
        """Forward of a (ragged, padded) tree block after the committed rows, at positions ``lens +
        depth``: nodes ``q_start..T-1`` only (rows below ``q_start`` were written by an earlier call).

        Shape: tokens int64 [B, T - q_start], parents int32 [B, T], num_nodes int32 [B] or None (all
        valid), features [B, T - q_start, H] or None -> logits [B, T - q_start, V] (model dtype); with
        ``want_hidden`` (logits, hidden [B, T - q_start, H]: the LM head's input of the same rows)."""
        self.forwards += 1
        mask, depth = build_tree_mask(parents, num_nodes, check=False)
        block_lens = num_nodes if num_nodes is not None else torch.full_like(self.lens, parents.shape[1])
        logits = self._captured(self.forward_mask, tokens, mask[:, q_start:], depth[:, q_start:], block_lens,
                                q_start=q_start, features=features, want_hidden=want_hidden)
        if want_hidden:
            return logits, self._hidden[:, : tokens.shape[1]]
        return logits

    def keep(self, accept_idx, accept_lens, host_counts=None, *, check=True):
        """Keeps the accepted block rows (and their features): one kv_compact; ``lens += accept_lens``.

        Shape: accept_idx int32 [B, A] (block node indices, strictly increasing, root first; entries
        from accept_lens[b] on are padding), accept_lens int32 [B]; host_counts: the same counts as a
        list (nothing is read back). ``check``: the acceptance's value checks (one sync)."""
        if self.keep_features and self._hidden is not None:  # before the commit: lens are the paths' starts
            B, A = accept_idx.shape
            j = torch.arange(A, device=self.device)
            valid = j[None, :] < accept_lens[:, None]  # [B, A]; padding goes to the spare row max_len
            pos = torch.where(valid, self.lens[:, None].long() + j, self.max_len)  # [B, A]
            bi = torch.arange(B, device=self.device)[:, None]
            rows = self._hidden[bi, accept_idx.long().clamp(0, self._hidden.shape[1] - 1)]  # [B, A, H]
            self._features_buf[bi, pos] = rows.to(self.features.dtype)
            self._hidden = None
        self.cache.compact(accept_idx, accept_lens, check=check, host_counts=host_counts)

    def truncate(self, new_lens, host_lens=None):
        """lens = new_lens, each <= lens: metadata only. ``new_lens``: a host list (one staged upload)
        or int32 [B] on the device with ``host_lens`` the same values as a list (no host sync)."""
        if not isinstance(new_lens, torch.Tensor):
            host_lens = list(new_lens)
            new_lens = self.stager.upload(host_lens).to(torch.int32)
        self.cache.truncate(new_lens, host_lens)

    # ---- the general forms -----------------------------------------------------------------------
    def prefill_padded(self, input_ids, lens, *, last_only=False, features=None):
        """Runs right-padded prompts from an empty cache and commits them.

        Shape: input_ids int [B, L], lens int32 [B] (1 <= lens <= L), features [B, L, H] or None ->
        logits [B, L, V] (model dtype; rows >= lens[b] are padding); with ``last_only`` [B, V], the
        logits after each prompt's last token (the LM head runs on those rows only)."""
        checks.tensor("input_ids", input_ids, dtype=(torch.int64, torch.int32), shape=(self.B, None),
                       device=self.device)
        B, L = input_ids.shape
        checks.lengths("lens", lens, B, self.device)
        if L > self.max_len:
            raise ValueError(f"input_ids: prompt of {L} tokens exceeds the cache (max_len={self.max_len})")
        checks.range_values("lens", lens, 1, L, "every prompt needs at least one token")
        self.cache.reset()
        if self.compiled is not None and self.compiled.takes(min(L, _compiled.MAX_BUCKET), L):
            return self._prefill_compiled(input_ids, lens, last_only, features)
        block = self._block(prefix_lens=torch.zeros_like(lens), block_lens=lens, mask=causal_mask(B, L, self.device),
                            q_lens=lens, longest=L)
        positions = torch.arange(L, device=self.device).expand(B, L)
        last = (lens.to(torch.int64) - 1)[:, None]  # [B, 1]
        keep = last if last_only and self._keeps_logits else None
        logits = self._run(input_ids, positions, block, offset=0, logits_to_keep=keep, features=features)
        self.cache.commit(lens)
        if last_only:
            if logits.dim() == 4:  # transformers < 5.20 indexes every row with the [B, 1] keep -> [B, B, 1, V]
                logits = logits[torch.arange(B, device=logits.device), torch.arange(B, device=logits.device)]
            if logits.shape[1] != 1:  # the model ignored logits_to_keep: pick the rows here
                logits = torch.take_along_dim(logits, last[..., None], dim=1)
            return logits[:, 0]
        return logits

    def _prefill_compiled(self, input_ids, lens, last_only, features):
        """``prefill_padded`` through the compiled block, in chunks of up to 64 rows (the one graph of
        every block size). Eagerly the per-op cost of 30 layers made a 58-token prompt's prefill ~1.4x
        the block's (104 vs 75 ms, SmolLM2); a long prompt reads the weights once per chunk, which the
        per-op cost outweighs as well (docs/compile.md, "Prefill"). A prompt ended before a chunk
        gets padding rows there (its count 0)."""
        B, L = input_ids.shape
        step = _compiled.MAX_BUCKET
        last = lens.to(torch.int64) - 1  # [B]: each prompt's last row
        bi = torch.arange(B, device=self.device)
        picked, logits, hiddens = None, [], []
        for s in range(0, L, step):
            Tq = min(step, L - s)
            counts = (lens - s).clamp(0, Tq)  # int32 [B]: each prompt's rows in this chunk
            parents = (torch.arange(Tq, dtype=torch.int32, device=self.device) - 1).expand(B, Tq)
            mask, depth = build_tree_mask(parents, counts, check=False)  # [B, Tq, W]; rows >= counts: padding
            feats = None if features is None else features[:, s:s + Tq]
            hidden = self.compiled.hidden(input_ids[:, s:s + Tq], mask, depth, counts, 0, feats)  # [B, Tb, H]
            if last_only:  # the LM head runs once, on each prompt's last row
                row = hidden[bi, (last - s).clamp(0, Tq - 1)]  # [B, H]
                picked = row if picked is None else torch.where(((last >= s) & (last < s + Tq))[:, None], row, picked)
            else:
                logits.append(self.compiled.logits(hidden[:, :Tq]))  # [B, Tq, V]
            if self.keep_features:  # the hook saw this chunk's rows (the norm's, or the head's input)
                hiddens.append(self._hidden[:, :Tq])
            self.cache.commit(counts, check=s + Tq >= L)  # the last commit checks all and syncs once
        if self.keep_features:
            self._hidden = torch.cat(hiddens, 1)  # [B, L, H]
        return self.compiled.logits(picked[:, None])[:, 0] if last_only else torch.cat(logits, 1)

    def forward_mask(self, tokens, mask, depth, block_lens, *, q_start=0, features=None):
        """The general form of ``forward``: any visibility mask (DAG, lookahead window) over the block.

        Shape: tokens int [B, Tq], mask int32 [B, Tq, W] (visibility of block keys 0..), depth int32
        [B, Tq] (position = lens + depth), block_lens int32 [B] (valid block rows incl. these queries;
        query rows >= block_lens - q_start are padding), features [B, Tq, H] or None -> logits
        [B, Tq, V] (model dtype). Under ``compile=True`` a block over 64 rows (or past a sliding
        window) runs eagerly."""
        checks.tensor("tokens", tokens, dtype=(torch.int64, torch.int32), shape=(self.B, None),
                       device=self.device)
        Tq = tokens.shape[1]
        longest = max(self.cache.host_lens()) + q_start + Tq
        if longest > self.max_len:
            raise ValueError(f"forward_mask: cache overflow: the longest sequence holds {longest - q_start - Tq} "
                             f"rows, {q_start + Tq} more would exceed max_len={self.max_len}")
        if self.compiled is not None and self.compiled.takes(Tq, longest):
            return self.compiled.forward(tokens, mask, depth, block_lens, q_start, features)
        block = self._block(prefix_lens=self.lens, block_lens=block_lens, mask=mask, q_lens=block_lens - q_start,
                            longest=longest)
        positions = self.lens[:, None].to(torch.int64) + depth
        return self._run(tokens, positions, block, offset=q_start, features=features)

    def _block(self, **kw):
        return Block(**kw, invariant=self.batch_invariant, page_table=self.cache.layout.page_table,
                     page_size=self.cache.page_size)

    def _run(self, ids, positions, block, offset, logits_to_keep=None, features=None):
        # The block travels as one keyword down to every layer's attention; its packed mask as the
        # 4-D attention_mask, which HF's mask builders pass through (no dense mask is built).
        self.cache.begin_block(offset, ids.shape[1])
        kw = {k: v for k, v in (("logits_to_keep", logits_to_keep), ("features", features)) if v is not None}
        kw[BLOCK_KW] = block
        try:
            out = self.model(input_ids=ids.long(), position_ids=positions.long(), past_key_values=self.cache,
                             attention_mask=block.mask[:, None], use_cache=True, **kw)
        finally:
            self.cache.end_block()
        return out.logits if self.vocab_keep is None else out.logits.index_select(-1, self.vocab_keep)


def pad_batch(seqs, pad=0):
    """Right-padded ids and lengths (prefill only). Shape: -> int64 [B, max len], int32 [B]."""
    L = max(len(s) for s in seqs)
    ids = torch.tensor([list(s) + [pad] * (L - len(s)) for s in seqs], dtype=torch.int64)
    return ids, torch.tensor([len(s) for s in seqs], dtype=torch.int32)
