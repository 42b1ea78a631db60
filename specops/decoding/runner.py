"""One model runner for target and draft, and the one way host data reaches the device.

:class:`ModelRunner` drives a stock HF causal LM through a
``specops.integrations.transformers.SpecModel`` (its static or paged KV cache and the "specops"
attention implementation) with three calls on device tensors::

    prefill(prompts)                               # commits the prompts -> logits [B, V] after each
    forward(tokens, parents, num_nodes, q_start=0) # a (growing) tree block after the committed rows
                                                   # -> logits [B, T - q_start, V]
    keep(accept_idx, accept_lens, host_counts)     # accepted block rows to lens.., lens += accept_lens

The target and the draft are both ModelRunners (the draft's block bookkeeping is
:class:`~specops.decoding.draft_lm.DraftLM`, a subclass); both keep accepted rows with the same
``keep`` (one kv_compact; a chain prefix moves each row onto itself).

:class:`Stager` is the only path from host lists to the device inside a decode step: values are
written into a preallocated host buffer (pinned when the device is CUDA) through a NumPy view
created once, and copied with ``non_blocking=True`` — no tensor is constructed from host data and no
copy blocks the host. A ring of slots (each guarded by a CUDA event) lets the host refill one slot
while an earlier copy is still in flight.

``set_runner_factory`` swaps the SpecModel constructor (tests use it to prove bad input fails before
any work, or to run paged caches).
"""
import torch

from . import _kernels

_factory = None


def set_runner_factory(factory):
    """``factory(model, batch_size, max_len) -> runner``; None restores the default. Returns the old one."""
    global _factory
    old, _factory = _factory, factory
    return old


def make_runner(model, batch_size, max_len, **runner_kw):
    """The SpecModel for ``model``; ``runner_kw`` (e.g. ``kv_layout``, ``page_size``) go to SpecModel
    (and to a factory only when given, so factories of the plain signature keep working)."""
    if _factory is not None:
        return _factory(model, batch_size, max_len, **runner_kw)
    try:
        from specops.integrations.transformers import SpecModel
    except ImportError as err:
        raise RuntimeError(
            "the specops model runner (specops.integrations.transformers.SpecModel) is not available "
            f"in this build: {err}") from err
    return SpecModel(model, batch_size, max_len, **runner_kw)


class Stager:
    """Uploads host int lists as int64 device tensors: one non-blocking copy per call.

    Shape: ``upload(values)`` list of n ints -> int64 [n] on ``device``."""

    SLOTS = 4

    def __init__(self, device, capacity=256):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._slots = [None] * self.SLOTS
        self._events = [None] * self.SLOTS
        self._next = 0
        self.uploads = 0  # staged copies made (a counter for tests and benchmarks)
        for i in range(self.SLOTS):
            self._alloc(i, capacity)

    def _alloc(self, i, n):
        host = torch.empty(n, dtype=torch.int64, pin_memory=self._cuda)
        self._slots[i] = (host, host.numpy())  # the NumPy view: writes reach the buffer, no tensor built

    def upload(self, values):
        i = self._next
        self._next = (i + 1) % self.SLOTS
        n = len(values)
        if self._events[i] is not None:
            self._events[i].synchronize()  # only waits when the device is a whole ring behind
        if self._slots[i][0].numel() < n:
            self._alloc(i, max(n, 2 * self._slots[i][0].numel()))
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

    ``lens`` int32 [B] (device) are the committed rows; ``host_lens`` mirrors them on the host,
    kept fresh from the counts the caller already has (the step's packed read), so no call reads
    the device. With ``keep_features``, ``features`` [B, max_len, H] (model dtype) holds the LM
    head's input (the final hidden state after the final norm) at every committed position ``p``,
    i.e. the state that produced the logits for token ``p + 1`` (for EAGLE-style drafters): filled
    at prefill and by every ``keep``; rows at or past ``lens[b]`` are unspecified. A forward hook on
    the decoder's final norm (or a pre-hook on the output embedding of a model without one) captures
    it, only for this runner's own forwards and only when ``keep_features`` is set.

    ``runner_kw`` go to SpecModel (``kv_layout``, ``page_size``: see ``generate``)."""

    def __init__(self, model, batch_size, max_len, keep_features=False, **runner_kw):
        self.model = model
        self.spec = make_runner(model, batch_size, max_len, **runner_kw)
        self.B = batch_size
        self.max_len = max_len
        self.device = self.spec.lens.device
        self.stager = Stager(self.device)
        self.host_lens = [0] * batch_size
        self.forwards = 0
        self.keep_features = bool(keep_features)
        self.features = None
        self._hidden = None  # [B, T, H]: LM-head input of the latest forward
        self._capturing = False  # the hook records only our own forwards (a draft may share the model)
        self._hook = None
        if self.keep_features:
            self._install_feature_hook(model, batch_size, max_len)

    @property
    def lens(self):
        """The committed lengths, int32 [B] (device)."""
        return self.spec.lens

    # ---- features --------------------------------------------------------------------------------

    def _install_feature_hook(self, model, batch_size, max_len):
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError("keep_features needs a model with an output embedding (LM head)")
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        param = next(model.parameters())
        # One spare row past max_len: ``keep`` sends the padding entries of an accepted path there
        # instead of filtering them (a filter would read back a count).
        self._features_buf = torch.zeros(batch_size, max_len + 1, cfg.hidden_size, dtype=param.dtype,
                                         device=self.device)
        self.features = self._features_buf[:, :max_len]
        self._spare_row = max_len
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        norm = getattr(decoder, "norm", None)
        if isinstance(norm, torch.nn.Module):
            self._hook = norm.register_forward_hook(self._capture_norm)
        else:
            self._hook = head.register_forward_pre_hook(self._capture)
        self._all_rows = not isinstance(norm, torch.nn.Module)  # the head must see every row

    def _capture(self, module, args):
        if self._capturing:
            self._hidden = args[0]

    def _capture_norm(self, module, args, output):
        if self._capturing:
            self._hidden = output

    def close(self):
        """Removes the feature hook (a runner is per decode; the model lives on)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _run(self, fn, *args, **kw):
        self._capturing = self.keep_features
        try:
            return fn(*args, **kw)
        finally:
            self._capturing = False

    # ---- the three calls -------------------------------------------------------------------------

    def prefill(self, prompts, logits=True):
        """Commits the prompts (lists of token ids). Shape: -> logits [B, V] after each prompt's last
        token (model dtype), or None when ``logits`` is False (the LM head then runs on those rows
        only, or not at all where the model allows)."""
        ids, lens = pad_batch(prompts)
        ids, lens = ids.to(self.device), lens.to(self.device)
        all_rows = self.keep_features and self._all_rows
        if all_rows or not getattr(self.spec, "prefill_last_only", False):
            out = self._run(self.spec.prefill, ids, lens)
            out = out[torch.arange(self.B, device=out.device), lens.long() - 1]
        else:
            out = self._run(self.spec.prefill, ids, lens, last_only=True)
        if self.keep_features:
            self.features[:, : ids.shape[1]] = self._hidden.to(self.features.dtype)
            self._hidden = None
        self.host_lens = [len(p) for p in prompts]
        return out if logits else None

    def forward(self, tokens, parents, num_nodes, q_start=0):
        """Forward of a (ragged, padded) tree block after the committed rows; logits of nodes
        ``q_start..T-1`` only (rows below ``q_start`` hold their K/V from an earlier call on the
        same block).

        Shape: tokens int64 [B, T - q_start], parents int32 [B, T], num_nodes int32 [B]
        -> logits [B, T - q_start, V]."""
        self.forwards += 1
        return self._run(self.spec.forward_block, tokens, parents, num_nodes=num_nodes, q_start=q_start)

    def keep(self, accept_idx, accept_lens, host_counts):
        """Keeps, per sequence, the accepted block rows (and their features): one kv_compact on the
        device, nothing read back.

        Shape: accept_idx int32 [B, A] (block node indices, strictly increasing, root first; entries
        at or past accept_lens[b] are padding), accept_lens int32 [B] (0 keeps nothing);
        host_counts: the same counts as a list (the caller read them), so ``host_lens`` stays fresh."""
        if self.keep_features and self._hidden is not None:
            self._keep_features(accept_idx, accept_lens)
        self.spec.compact(accept_idx, accept_lens, check=_kernels.CHECK, host_counts=host_counts)
        self.host_lens = [n + c for n, c in zip(self.host_lens, host_counts)]

    def truncate(self, new_lens):
        """lens = new_lens (a host list, each <= lens): metadata only, one staged upload."""
        self.spec.truncate(self.stager.upload(new_lens).to(torch.int32), list(new_lens))
        self.host_lens = list(new_lens)

    def _keep_features(self, accept_idx, accept_lens):
        # Before the cache commits: lens are still the positions the paths start at.
        B, A = accept_idx.shape
        dev = self.features.device
        T = self._hidden.shape[1]
        j = torch.arange(A, device=dev)
        valid = j[None, :] < accept_lens[:, None]  # [B, A]
        pos = torch.where(valid, self.lens[:, None].long() + j, self._spare_row)  # [B, A]
        bi = torch.arange(B, device=dev)[:, None]
        rows = self._hidden[bi, accept_idx.long().clamp(0, T - 1)]  # [B, A, H]
        self._features_buf[bi, pos] = rows.to(self.features.dtype)
        self._hidden = None


def pad_batch(seqs, pad=0):
    """Right-padded ids and lengths (prefill only). Shape: -> int64 [B, max len], int32 [B]."""
    L = max(len(s) for s in seqs)
    ids = torch.tensor([list(s) + [pad] * (L - len(s)) for s in seqs], dtype=torch.int64)
    return ids, torch.tensor([len(s) for s in seqs], dtype=torch.int32)
