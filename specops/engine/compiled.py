"""Compiled block forwards for :class:`~specops.engine.ModelRunner` (``compile=True``): one
:class:`CompiledDecoder` per model, shared by its runners, runs the HF decoder (embedding, layers whose
``"specops"`` attention writes K/V straight into the cache's storage, final norm) under
``torch.compile(fullgraph=True)``, the block's row count a symbol (on a CPU, :data:`LAYERED` decoders
as one graph of :func:`run_length` layers called per run); the LM head and the final norm's hooks run
on its output. Default-mode graphs are saved to disk. How and why: docs/compile.md §How a block
becomes a graph, §Warm-up, caching and what is reported."""
import contextlib
import functools
import hashlib
import inspect
import os
import re
import sys
import time
import weakref

import torch
import torch._inductor.config as inductor_config

from .. import models
from .attention import BLOCK_KW, CompiledBlock

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # CUDA graphs' row buckets (static shapes)
MAX_BUCKET = BUCKETS[-1]  # the most rows a compiled forward takes
BLOCK = "1-64"  # the graph key's row count of the dynamic-rows graph (1..MAX_BUCKET rows)
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def bucket_for(T):
    """The bucket a block of ``T`` query rows is padded to, or None when ``T > max(BUCKETS)``."""
    return next((b for b in BUCKETS if b >= T), None)


def mask_words(T):
    """The padded mask width (int32 words) for a block of ``T`` nodes: a power of two >= ceil(T/32)."""
    w = 1
    while 32 * w < T:
        w *= 2
    return w


MASK_WORDS = mask_words(MAX_BUCKET)  # every compiled forward's mask width: one shape for all blocks


def set_cache_dir():
    """Points inductor's on-disk caches at ``<specops cache>/inductor`` unless the user chose a place
    (torch's own temporary default in ``TORCHINDUCTOR_CACHE_DIR`` is no choice; docs/compile.md)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(models.cache_dir(), "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


# Inductor's options for a CPU graph: the C++ wrapper, built apart from the kernels (docs/compile.md,
# "The C++ wrapper"), without runtime shape and stride asserts (this module builds the inputs).
CPU_OPTIONS = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True, "size_asserts": False,
               "scalar_asserts": False, "alignment_asserts": False}


_DECODERS = {}  # model -> {mode: CompiledDecoder}; holds the model (the graphs run its modules)


def decoder_for(model, mode="default"):
    """The process-wide :class:`CompiledDecoder` of ``model`` under ``mode``. It keeps ``model``
    (and its pooled caches) alive until :func:`release`."""
    per_model = _DECODERS.setdefault(model, {})
    if mode not in per_model:
        per_model[mode] = CompiledDecoder(model, mode)
    return per_model[mode]


def release(model):
    """Drops ``model``'s compiled decoders and pooled caches (dynamo's code cache keeps the graphs)."""
    _DECODERS.pop(model, None)


class _Decoder:
    """The function the graphs compile, bound to this object alone: a saved graph's guards pickle what
    its ``self`` holds (modules by reference), which must not be the decoder's table of graphs."""

    def __init__(self, model, decoder):
        self.model, self.decoder = model, decoder

    def forward(self, ids, positions, mask, block, feats):
        kw = {"position_ids": positions, "attention_mask": mask, "use_cache": False, BLOCK_KW: block}
        if feats is not None:  # a feature (EAGLE-style) draft: its own input layer before the decoder
            return self.model.hidden(ids, feats, **kw)[0]
        return self.decoder(input_ids=ids, **kw).last_hidden_state


class _Layers:
    """The layered graph's function: a run of ``len(layers)`` decoder layers, called per run with its
    modules and stores (one graph serves every run). Shape: hidden [B, Tb, H]; cos, sin [B, Tb, D];
    positions int64 [B, Tb]; mask int32 [B, 1, Tb, W]; k, v: the run's stores ([n, B, Hkv, S, D]
    contiguous, [n, N, ps, Hkv, D] paged) -> hidden [B, Tb, H]."""

    def forward(self, layers, hidden, cos, sin, positions, mask, block, k, v):
        for j, layer in enumerate(layers):
            own = CompiledBlock(block.impl, block.prefix_lens, block.block_lens, block.q_lens, block.mask,
                                block.rows, k, v, block.page_table, block.invariant, j)
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin),
                           use_cache=False, **{BLOCK_KW: own})
        return hidden


def run_length(layers, most=8):
    """How many layers one call of the layered graph runs: the largest divisor of ``layers`` up to
    ``most`` (each call costs ~0.15 ms of wrappers on a CPU; each layer in the graph, compile time)."""
    return max(n for n in range(1, min(layers, most) + 1) if layers % n == 0)


# Decoders whose forward is embed -> rotary -> every layer with (cos, sin) -> norm, as written in
# CompiledDecoder._run_layered (the HF forwards of these classes read so, for a 4-D mask).
LAYERED = ("LlamaModel", "Qwen2Model", "Qwen3Model", "MistralModel")


class CompiledDecoder:
    """``model``'s decoder (up to the final norm) under torch.compile, shared by the model's runners.
    ``compile_s[key]``: seconds the first call of a graph key took (trace, codegen or disk hit, one run)."""

    def __init__(self, model, mode="default"):
        if mode not in MODES:
            raise ValueError(f"compile_mode must be one of {MODES}, got {mode!r}")
        set_cache_dir()
        cfg = torch._dynamo.config
        # One graph per (model, bucket, mask width, batch, layout, grad mode), all entries of the code
        # object _Decoder.forward: target and draft, both layouts and every bucket passed 64
        # (bench/batch_invariant.py: a hard failure under fullgraph=True).
        cfg.recompile_limit = max(cfg.recompile_limit, 1024)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 8192)
        self.model = model
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
        norm = getattr(self.decoder, "norm", None)
        self.norm = norm if isinstance(norm, torch.nn.Module) else None
        self.mode = mode
        self.cudagraphs = mode == "reduce-overhead"
        self.name = getattr(model, "specops_name", None) or type(model).__name__
        param = next(model.parameters(), None)
        cpu = mode == "default" and (param is None or param.device.type == "cpu")
        self.options = {"options": CPU_OPTIONS} if cpu else {} if mode == "default" else {"mode": mode}
        self._step = _Decoder(model, self.decoder)
        self._fn, self._aot_fn = self._compile(self._step.forward)
        # CPU, default mode: one graph of a run of layers (see the module). CUDA graphs want the whole step.
        self.layered = cpu and type(self.decoder).__name__ in LAYERED
        if self.layered:
            self._layers = _Layers()
            layers = tuple(self.decoder.layers[:self.decoder.config.num_hidden_layers])
            self.run_length = n = run_length(len(layers))
            self._runs = [layers[i:i + n] for i in range(0, len(layers), n)]
            self._layers_fn, self._layers_aot = self._compile(self._layers.forward)
        self.compile_s = {}
        self._seen = set()  # (key, grad mode, inference mode) of every graph that ran
        self._loaded = set()  # the seen keys whose graph is a saved one (no guards: any row count runs)
        self._saved = {} if mode == "default" else None  # seen -> graph loaded from / saved to disk
        self._checked = {}  # (seen, cache storage) -> its saved graph, once its input signature matched
        self._hot = set()  # the _checked tokens whose graph is a saved one: a call neither traces nor compiles
        self._model_digest = None  # saved_path's digest of the model, the code and the options
        self._unsaved = set()  # seen keys that cannot be compiled ahead of time (dynamo's cache runs them)
        self._caches = {}  # (batch, layout, page size, dtype) -> (cache, weakref to the runner using it)
        self._frozen = False  # inside frozen(): a graph not yet run raises instead of compiling

    def _compile(self, fn):
        """``fn`` under torch.compile, and (default mode only: torch.compile takes a mode or options, not
        both) compiled ahead of time for :meth:`_saved_graph`. Guards on object identities cannot be
        saved: the graph's key (model, batch, layout, modes), which names the file, stands for them."""
        dynamo = torch.compile(fn, fullgraph=True, dynamic=False, **self.options)
        if self.mode != "default":
            return dynamo, None
        options = dict(self.options.get("options", {}), guard_filter_fn=_saveable_guards)
        with torch._dynamo.config.patch(enable_aot_compile=True):
            # dynamic=False as for dynamo: only the dimensions marked dynamic are symbols (automatic
            # dynamism would carry other models' graphs of this code object into this one, e.g. a float
            # made an input, which aot_compile cannot trace).
            return dynamo, torch.compile(fn, fullgraph=True, dynamic=False, options=options)

    def cache_for(self, runner, make, rows, key):
        """A KV cache of at least ``rows`` rows for ``runner``: a gone earlier runner's with the same
        ``key`` (reset), else ``make(rows)`` (docs/compile.md, "One graph for every cache length")."""
        key = key + (torch.is_inference_mode_enabled(),)  # inference tensors make other graphs
        entry = self._caches.get(key)
        if entry is not None and entry[1]() is None and entry[0].max_len >= rows:
            cache = entry[0]
            cache.reset()
        else:
            cache = make(rows)
        self._caches[key] = (cache, weakref.ref(runner))
        return cache

    @contextlib.contextmanager
    def frozen(self):
        """A region (timed work after a warm-up) where a forward needing a new graph or a dynamo
        recompile raises RuntimeError instead of compiling."""
        outer, self._frozen = self._frozen, True
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                yield self
        finally:
            self._frozen = outer

    def __call__(self, key, ids, positions, mask, block, feats=None, marks=()):
        """Runs the graph of ``key`` (bucket first). Shape: ids, positions int64 [B, Tb]; mask int32
        [B, 1, Tb, W]; feats [B, Tb, H] or None -> (final hidden states [B, Tb, H] in the model's
        dtype, seconds spent compiling in this call). ``marks``: (tensor, dim) pairs dynamic in
        [2, MAX_BUCKET], marked for a call that may trace or compile (not for a checked saved graph)."""
        if self._frozen and key not in self.compile_s:
            raise RuntimeError(f"specops: {self.name} needs a new compiled graph (rows {key[0]}, mask words "
                               f"{key[1]}, batch {key[2]}, {key[3]} cache) inside frozen(): warm it up before")
        hooks = {} if self.norm is None else dict(self.norm._forward_hooks)
        if hooks:  # applied below, to the graph's output
            self.norm._forward_hooks.clear()
        graphs = _graph_count()
        if key not in self.compile_s:
            print(f"specops: {self.name}'s graph for blocks of {key[0]} row{'s' * (key[0] != 1)} "
                  f"(batch {key[2]}, {key[3]} cache): loading it, or compiling it once ...",
                  file=sys.stderr, flush=True)
        try:
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            t0 = time.perf_counter()
            seen = (key, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
            ptr = block.k_store.untyped_storage().data_ptr()
            # A checked saved graph is plain compiled code: no marks, no config (~0.1 ms a call).
            hot = (seen, ptr) in self._hot or (seen, "layered", ptr) in self._hot
            for t, dim in () if hot else marks:
                torch._dynamo.mark_dynamic(t, dim, min=2, max=MAX_BUCKET)
            # Rounding every bf16/fp16 intermediate as eager torch does makes a row's bits independent
            # of inductor's fusion choices, which differ between buckets: without it a block's rows
            # and AR's one-row steps round differently and the batch-invariant mode is not exact.
            with contextlib.nullcontext() if hot else inductor_config.patch(emulate_precision_casts=True):
                hidden, how = self._run(seen, ids, positions, mask, block, feats)
            dt = time.perf_counter() - t0
            self._seen.add(seen)
            if self.cudagraphs:  # a replay overwrites its outputs: keep ours
                hidden = hidden.clone()
        finally:
            if hooks:
                self.norm._forward_hooks.update(hooks)
        # Whether this call compiled is dynamo's word (a new grad mode, say, also compiles a graph).
        first = how is not None or _graph_count() != graphs
        if first:
            self.compile_s[key] = self.compile_s.get(key, 0.0) + dt
            print(f"specops: {how or 'compiled'} in {dt:.1f} s", file=sys.stderr, flush=True)
        elif key not in self.compile_s:  # dynamo's graph of another model of the same architecture
            print("specops: reused a compiled graph", file=sys.stderr, flush=True)
            self.compile_s[key] = 0.0
        # The final norm's forward hooks see its output here, not in the graph (see the module).
        for hook in hooks.values():
            res = hook(self.norm, (hidden,), hidden)
            hidden = hidden if res is None else res
        return hidden, (dt if first else 0.0)

    def _run(self, seen, *args):
        """Runs the graph of ``seen`` (key, grad mode, inference mode) -> (hidden, "loaded from <file>",
        "compiled and saved to <file>" or None): the saved graph (default mode), checked once per (key,
        cache storage), else dynamo's with its guards skipped once warm, else with full guards
        (docs/compile.md, "Guards once", §Saved graphs)."""
        if self.layered and args[4] is None:
            return self._run_layered(seen, *args[:4])
        if self._saved is not None and seen not in self._unsaved:
            token = (seen, args[3].k_store.untyped_storage().data_ptr())
            graph, how = self._checked.get(token), None
            if graph is None:
                graph, how = self._saved_graph(seen, args, self._aot_fn)
            if graph is not None:
                self._checked[token] = graph
                self._hot.add(token)
                self._loaded.add(seen)
                return graph(self._step, *args), how
        if seen in self._seen:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._fn(*args), None
            except RuntimeError as e:
                if "skip_guard_eval_unsafe" not in str(e):
                    raise
        return self._fn(*args), None

    def _run_layered(self, seen, ids, positions, mask, block):
        """The decoder as one graph of :attr:`run_length` layers called per run of layers; the
        embedding, rotary tables and final norm run eagerly (a handful of ops). -> (hidden [B, Tb, H],
        how the graph was got or None)."""
        d = self.decoder
        hidden = d.embed_tokens(ids)  # [B, Tb, H]
        cos, sin = d.rotary_emb(hidden, position_ids=positions)  # [B, Tb, D] each
        n, k, v = self.run_length, block.k_store, block.v_store
        token = (seen, "layered", k.untyped_storage().data_ptr())
        graph, how = self._checked.get(token), None
        if graph is None:
            for t in (hidden, cos, sin):
                torch._dynamo.mark_dynamic(t, 1, min=2, max=MAX_BUCKET)
            args = (self._runs[0], hidden, cos, sin, positions, mask, block, k[:n], v[:n])
            dim = 3 if block.page_table is None else 1  # the stores' row (page) dim
            for t in args[-2:]:
                if t.shape[dim] > 1:
                    torch._dynamo.mark_dynamic(t, dim)
            graph, how = self._saved_graph(seen, args, self._layers_aot)
            if graph is None:  # dynamo's cache runs it (guarded: one-row blocks stay padded to two)
                graph = functools.partial(_unbound, self._layers_fn)
            else:
                self._hot.add(token)
                self._loaded.add(seen)
            self._checked[token] = graph
        for i, run in enumerate(self._runs):
            hidden = graph(self._layers, run, hidden, cos, sin, positions, mask, block,
                           k[i * n:(i + 1) * n], v[i * n:(i + 1) * n])
        return d.norm(hidden), how

    def runs_one_row(self, key):
        """Whether the graph of ``key`` (current grad and inference modes) takes a one-row block: a saved
        graph runs unguarded; dynamo's were traced for >= 2 rows and guard on it."""
        return (key, torch.is_grad_enabled(), torch.is_inference_mode_enabled()) in self._loaded

    def saved_path(self, seen, sig):
        """The file of the graph ``seen`` for inputs of signature ``sig`` in the specops cache, named by the
        model's name (its last part where the model was loaded from a path, which names it) and a digest
        of everything the graph depends on (listed in docs/compile.md §Saved graphs)."""
        if self._model_digest is None:
            cfg = getattr(self.model, "config", None)
            params = [(n, tuple(p.shape), str(p.dtype), p.device.type) for n, p in self.model.named_parameters()]
            h = hashlib.sha256()
            for part in (torch.__version__, _source_digest(type(self.decoder), type(self.model)),
                         type(self.model).__qualname__,
                         cfg.to_json_string() if hasattr(cfg, "to_json_string") else repr(cfg), repr(params),
                         self.mode, repr(self.options), str(torch.backends.cpu.get_cpu_capability())):
                h.update(part.encode() + b"\0")
            self._model_digest = h.hexdigest()
        h = hashlib.sha256(f"{self._model_digest}\0{seen!r}\0{sig!r}".encode())
        stem = re.sub(r"[^\w.-]+", "_", os.path.basename(os.path.normpath(self.name)))
        return os.path.join(models.cache_dir(), "compiled", f"{stem}-{h.hexdigest()[:24]}.aot")

    def _saved_graph(self, seen, args, compiler):
        """(graph, how): the graph in memory for these inputs' signature (how: None), else the one at
        :meth:`saved_path`, else ``compiler``'s ahead-of-time graph, saved there; (None, None) when it
        cannot be compiled so (dynamo's cache runs it)."""
        sig = _signature(args)
        if (seen, sig) in self._saved:
            return self._saved[(seen, sig)], None
        path = self.saved_path(seen, sig)
        graph, how = None, f"loaded from {path}"
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    graph = torch.compiler.load_compiled_function(f)
            except Exception as e:  # a truncated file, say: compile it again
                print(f"specops: could not load {path} ({type(e).__name__}: {e}); compiling again",
                      file=sys.stderr, flush=True)
        if graph is None:
            try:
                graph = compiler.aot_compile((args, {}))
            except Exception as e:
                print(f"specops: this graph cannot be compiled ahead of time ({type(e).__name__}: {e}); "
                      "compiling it for this process only", file=sys.stderr, flush=True)
                self._unsaved.add(seen)
                return None, None
            how = f"compiled and saved to {path}"
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                graph.save_compiled_function(path)
            except Exception as e:
                print(f"specops: could not save the compiled graph to {path} ({type(e).__name__}: {e})",
                      file=sys.stderr, flush=True)
        graph.disable_guard_check()  # the file's name is the guard (saved_path)
        self._saved[(seen, sig)] = graph
        return graph, how


def _unbound(fn, _self, *args):
    """Calls a bound compiled method the way a saved graph is called (its object first)."""
    return fn(*args)


def _graph_count():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@functools.cache
def _source_digest(*model_types):
    """A digest of the code a graph traces: specops' engine and ops sources and the modules of the
    model's classes (its decoder's and its own: a feature draft's forward is specops code)."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    files = sorted(os.path.join(d, f) for top in (here, os.path.join(here, "..", "ops"))
                   for d, _, names in os.walk(top) for f in names if f.endswith(".py"))
    for path in files + sorted({inspect.getfile(t) for t in model_types}):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _signature(args):
    """What a saved graph assumes of its inputs: every tensor's dtype, device and sizes (-1 for the
    dimensions marked dynamic), and the other values (the block's kernel by name, flags)."""
    out = []
    for a in [x for arg in args for x in (arg if isinstance(arg, tuple) else (arg,))]:
        if isinstance(a, torch.nn.Module):
            out.append(f"{type(a).__module__}.{type(a).__qualname__}")
        elif isinstance(a, torch.Tensor):
            dyn = getattr(a, "_dynamo_dynamic_indices", ())
            out.append((str(a.dtype), a.device.type, tuple(-1 if d in dyn else n for d, n in enumerate(a.shape))))
        elif isinstance(a, functools.partial):  # e.g. the torch backend's attention, bound to a layout
            out.append((f"{a.func.__module__}.{a.func.__qualname__}", repr(a.args)))
        elif callable(a):
            out.append(f"{a.__module__}.{a.__qualname__}")
        else:
            out.append(repr(a))
    return tuple(out)


def _saveable_guards(entries):
    """Keeps the guards a saved graph can carry: not those on globals or on object identities."""
    bad = torch._dynamo.guards.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (e.is_global or e.guard_type in bad or any(t in bad for t in e.derived_guard_types))
            for e in entries]
