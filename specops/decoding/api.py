"""``specops.generate``: the public entry point (a contract; code outside this repo calls it), in
three phases: validation (no model needed), setup (models, prompts, cache size, grammar; every
check before any forward) and the run."""
import weakref
from dataclasses import dataclass

import torch

from .. import models, parallel
from ..draft_models import is_feature_draft
from ..engine.runner import LINEARS
from . import adaptive as _adaptive
from . import methods
from .draft_lm import DraftLM
from .eagle import FeatureDraftLM
from .grammar import Grammar
from .loop import TargetLM, decode
from .sampling import SamplingConfig
from .stopping import Stopper


def generate(target, prompt, *, draft=None, method="ngram", max_new_tokens=64, temperature=0.0, top_k=0,
             top_p=1.0, stop=None, eos_token_id=None, tokenizer=None, seed=0, dtype=None, max_len=None,
             compare_ar=False, stream=None, record_steps=False, adaptive=True, kv_layout="contiguous",
             page_size=16, tp_size=None, logprobs=False, compile=False, compile_mode="default", linear="auto",
             batch_invariant="auto", json_schema=None, regex=None, ebnf=None, grammar_engine=None, **method_params):
    """Generates with ``method`` -> ``(new_tokens, metrics)`` (examples: README.md §Using it).

    Shape: -> new_tokens int64 [B, n]: the generated tokens only, right-padded with the pad token
    where a sequence stopped early (``metrics.lengths``: each length).

    target: an HF causal LM, an embedded name ("smollm2-135m", "gemma3-270m") or a model path.
    prompt: a string or strings (tokenised by the target's tokenizer), a LongTensor [B, L] or [L], or
        token-id lists (ragged batches).
    draft: an HF model, an embedded name ("smollm2-135m-int8", ...), a path, or None (the method's
        default: the best embedded draft for an embedded target; model-free methods need none).
    method: a name in ``specops.decoding.METHODS`` (docs/methods.md §Which method for which text);
        ``method_params``: its parameters.
    temperature / top_k / top_p: sampling, draft and target alike (temperature 0 = greedy); seed:
        of the one generator all randomness comes from.
    stop: stop strings (need a tokenizer); eos_token_id: int or list (None = the model's; [] = none).
    dtype: for models loaded by name ("bf16" default, "fp32"); max_len: cache length (default: what
        this call needs, checked against the model's max_position_embeddings).
    compare_ar: also decode AR (same settings and process): ``metrics.ar_tokens_per_s`` / ``speedup``.
    stream: ``callable(b, token_ids)`` called as tokens are emitted.
    adaptive: True (default) sizes every block from the acceptance and step costs seen so far, down
        to AR steps (docs/methods.md §Adaptive speculation); False keeps the method's fixed budget;
        an ``AdaptiveConfig`` sets the controller.
    kv_layout: "contiguous" (default) or "paged" (pages of ``page_size`` rows, a power of two), for
        target and draft caches alike; greedy output is the same.
    compile: target and draft forwards of up to 64 rows under ``torch.compile(fullgraph=True)``
        (``compile_mode``: torch.compile's; docs/compile.md), greedy output eager's; compiling is
        ``metrics.compile_time_s``, left out of the decode time.
    linear: "auto" (default) runs a bf16/fp16 CPU model's linear layers through
        :func:`specops.linear`, "specops" any model's, "torch" none (docs/batch_invariance.md).
    batch_invariant: True runs the target's linears and attention batch-invariant, so every lossless
        method's greedy output is ``method="ar"``'s token for token, in bf16 too, whatever the
        batch-mates (needs a CPU fp32/bf16/fp16 target of plain ``nn.Linear`` layers and ``linear``
        "auto" or "specops"); "auto" (default): on for such a bf16/fp16 target unless ``linear="torch"``.
    json_schema / regex / ebnf: at most one: a JSON schema (dict or string), a regex the whole output
        matches or an EBNF/GBNF grammar with rule ``root`` (``grammar_engine``: "xgrammar", default, or
        "llguidance"; needs a tokenizer and specops[grammar]). Every method's output follows it,
        verified exactly; its end stops a sequence (docs/structured.md).
    logprobs: also sum the emitted tokens' target log-likelihood (``metrics.perplexity``; a gather
        per step); always on for the methods that are not lossless (MJSD, GSD's R5).
    tp_size: under torchrun, the ranks a target loaded by name or path is sharded over (None: the
        world size, 1 outside torchrun; docs/scaling.md); a model passed in must match it if given.

    Bad input (unknown method or parameter, a value of the wrong type or out of range, a draft with
    another vocabulary, an empty prompt or one too long for the cache, ...) raises ValueError naming
    the parameter and showing its value before any model forward (TypeError for a ``stream`` that is
    not callable or a target/draft that is not a model).
    """
    # validation: all that needs no model
    drafter = methods.make(method, **method_params)
    adaptive = _adaptive.resolve(adaptive)
    if adaptive is not None:
        drafter.enable_adaptive(adaptive)  # before tree_budget(): the caches hold the largest budget
    sampling = SamplingConfig(temperature, top_k, top_p)
    stop = _check_args(max_new_tokens, stop, eos_token_id, tokenizer, seed, dtype, max_len, compare_ar,
                       stream, record_steps, logprobs)
    runner_kw = runner_keywords(kv_layout, page_size, compile, compile_mode, linear)
    _require(isinstance(batch_invariant, bool) or batch_invariant == "auto", "batch_invariant",
             "True, False or 'auto'", batch_invariant)
    if batch_invariant is True and linear == "torch":
        raise ValueError("batch_invariant=True runs every linear through specops.linear: linear must be "
                         "'auto' or 'specops', got 'torch'")
    tp = _check_tp_size(tp_size, target)
    req = _setup(target, prompt, draft, drafter, method, dtype, tp, tokenizer, eos_token_id, max_new_tokens,
                 max_len, runner_kw, stop, json_schema=json_schema, regex=regex, ebnf=ebnf,
                 grammar_engine=grammar_engine)
    metrics_ar = None
    if compare_ar and method != "ar":
        _, metrics_ar = generate(req.target, [list(p) for p in req.prompts], method="ar",
                                 max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                 stop=stop, eos_token_id=eos_token_id, tokenizer=req.tokenizer, seed=seed,
                                 max_len=req.max_len, kv_layout=kv_layout, page_size=page_size, tp_size=tp_size,
                                 compile=compile, compile_mode=compile_mode, linear=linear,
                                 batch_invariant=batch_invariant, json_schema=json_schema, regex=regex, ebnf=ebnf,
                                 grammar_engine=grammar_engine)
    gen, metrics = _run(req, drafter, sampling, seed, runner_kw, batch_invariant, adaptive, stream=stream,
                        record_steps=record_steps, logprobs=logprobs)
    if compare_ar:  # method="ar" is its own AR run
        metrics.ar_tokens_per_s = (metrics_ar or metrics).tokens_per_s
    pad = _pad_id(req.target, req.tokenizer)
    n = max(len(g) for g in gen)
    return torch.tensor([g + [pad] * (n - len(g)) for g in gen], dtype=torch.int64), metrics  # [B, n]


# ---- generate's setup and run phases -----------------------------------------------------------

@dataclass
class _Request:
    """What setup resolved: the models, the prompts, the cache length, the grammar and the stopper."""
    target: object  # the HF causal LM
    tokenizer: object  # or None
    prompts: list  # B token-id lists (ragged)
    draft_model: object  # or None (model-free methods)
    max_len: int  # cache rows per sequence
    grammar: object  # Grammar or None
    stopper: Stopper


def _setup(target, prompt, draft, drafter, method, dtype, tp, tokenizer, eos_token_id, max_new_tokens, max_len,
           runner_kw, stop, *, json_schema, regex, ebnf, grammar_engine):
    """Loads (or checks) the target and the draft, tokenises the prompts, sizes the cache, compiles
    the grammar: every check that needs a model, before any forward. -> _Request."""
    target_name = target if isinstance(target, str) else getattr(target, "specops_name", None)
    target, tok = _resolve_model(target, dtype, "target", tp)
    parallel.check_placement(target, "target")
    _check_weights(target, "target")
    tokenizer = tokenizer or tok
    prompts = _prompts(prompt, tokenizer)
    V = _vocab(target)
    for b, p in enumerate(prompts):
        bad = [i for i, t in enumerate(p) if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt {b} has token ids outside the target's vocabulary [0, {V}): "
                             f"got prompt[{b}][{bad[0]}] = {p[bad[0]]}")
    for t in [eos_token_id] if _is_int(eos_token_id) else (eos_token_id or ()):  # explicit stop ids
        if t >= V:
            raise ValueError(f"eos_token_id must lie in the target's vocabulary [0, {V}), got {t}")

    draft_model = None
    if drafter.needs_draft_model:
        if draft is None:
            if target_name is None or not models.is_embedded_name(target_name):
                raise ValueError(f"method {method!r} needs a draft model: pass draft= (an HF model sharing "
                                 f"the target's tokenizer, or an embedded draft name)")
            draft = models.default_draft(target_name, next(target.parameters()).dtype)
        # Replicated on every rank of a tensor-parallel target: it is small, and a draft on one rank
        # would add a broadcast of every proposal while the other ranks wait.
        draft_model, draft_tok = _resolve_model(draft, None, "draft")
        parallel.check_placement(draft_model, "draft")
        _check_weights(draft_model, "draft", getattr(next(target.parameters(), None), "device", None))
        _check_same_vocab(target, tokenizer, draft_model, draft_tok)

    need = max(len(p) for p in prompts) + max_new_tokens + drafter.tree_budget() + 1
    limit = getattr(target.config, "max_position_embeddings", None)
    _check_block_fits(drafter, method, max_len, limit)
    if max_len is None:
        # A sequence may commit up to a whole accepted path past max_new_tokens (the stopper cuts the
        # emitted tokens, not the cache rows) while a batch-mate still drafts: one more block of slack.
        max_len = need + drafter.tree_budget()
        if limit is not None:
            max_len = min(max_len, max(limit, need))
    # a page holds at most the rows a sequence can use (page_size=2**28 would ask for GiBs)
    page_size, bound = runner_kw.get("page_size"), 1 << max(max_len - 1, 0).bit_length()
    if page_size is not None and page_size > bound:
        raise ValueError(f"page_size must be <= {bound} (a sequence's {max_len} cache rows rounded up to a "
                         "power of two; a larger page only allocates rows no sequence reaches), got "
                         f"{page_size}")
    if max_len < need or (limit is not None and need > limit):
        cap = f"max_len={max_len}" if max_len < need else f"the model's max_position_embeddings={limit}"
        raise ValueError(f"prompt too long for the cache: the longest prompt ({max(len(p) for p in prompts)} "
                         f"tokens) + max_new_tokens ({max_new_tokens}) + the {method} block "
                         f"({drafter.tree_budget()}) needs {need} positions, the cache holds {cap}")
    grammar, eos = None, _eos_ids(eos_token_id, target, tokenizer)
    if any(g is not None for g in (json_schema, regex, ebnf)):
        if tokenizer is None:
            raise ValueError("json_schema / regex / ebnf need a tokenizer: pass tokenizer= or a target loaded by name")
        grammar = Grammar(tokenizer, json_schema=json_schema, regex=regex, ebnf=ebnf, batch_size=len(prompts),
                          vocab_size=V, engine=grammar_engine)
        eos = sorted(set(eos) | set(grammar.stop_tokens))  # the grammar's end ends the sequence
    elif grammar_engine is not None:
        raise ValueError(f"grammar_engine is for json_schema / regex / ebnf, none was given (got grammar_engine="
                         f"{grammar_engine!r})")
    return _Request(target=target, tokenizer=tokenizer, prompts=prompts, draft_model=draft_model, max_len=max_len,
                    grammar=grammar, stopper=Stopper(max_new_tokens, eos, stop or (), tokenizer))


def _run(req, drafter, sampling, seed, runner_kw, batch_invariant, adaptive, *, stream, record_steps, logprobs):
    """Builds the runners and decodes. -> (generated token lists, metrics)."""
    B = len(req.prompts)
    # Every rank seeds the same generator and sees the same (gathered) logits, so every sampled token
    # agrees across tensor-parallel ranks without communication.
    generator = torch.Generator().manual_seed(seed)
    ranks = parallel.RankGroup.for_model(req.target)
    with torch.inference_mode():
        # A feature (EAGLE-style) draft reads the target's final hidden states of committed positions.
        feature = req.draft_model is not None and is_feature_draft(req.draft_model)
        runner = TargetLM(req.target, B, req.max_len,
                          keep_features=feature or getattr(drafter, "needs_target_features", False),
                          **runner_kw, batch_invariant=batch_invariant)
        try:
            dlm = None
            if req.draft_model is not None:
                dmax = req.max_len + drafter.draft_budget() + drafter.tree_budget() + 1
                draft_kw = dict(runner_kw, head_subset=drafter.uses_draft_vocab(sampling) and req.grammar is None)
                dlm = FeatureDraftLM(req.draft_model, B, dmax, runner, **draft_kw) if feature else \
                    DraftLM(req.draft_model, B, dmax, **draft_kw)
            runners = [r for r in (runner, dlm) if r is not None]
            compiling = sum(getattr(r, "compile_time_s", 0.0) for r in runners)
            gen, metrics = decode(runner, drafter, req.prompts, sampling=sampling, stopper=req.stopper,
                                  generator=generator, draft=dlm, tokenizer=req.tokenizer, stream=stream,
                                  record_steps=record_steps, adaptive=adaptive, ranks=ranks,
                                  track_logprobs=logprobs or None, grammar=req.grammar)
            # graphs compile on first use inside the decode: reported apart, not as decoding time
            metrics.compile_time_s = sum(getattr(r, "compile_time_s", 0.0) for r in runners) - compiling
            metrics.total_time_s -= metrics.compile_time_s
        finally:
            runner.close()
            if dlm is not None:
                dlm.close()
    return gen, metrics


# ---- argument checks ---------------------------------------------------------------------------

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _require(ok, name, want, value):
    """The shape of every plain argument check: ValueError ``"{name} must be {want}, got {value!r}"``."""
    if not ok:
        raise ValueError(f"{name} must be {want}, got {value!r}")


def _check_args(max_new_tokens, stop, eos_token_id, tokenizer, seed, dtype, max_len, compare_ar, stream,
                record_steps, logprobs):
    """Every plain parameter of ``generate``, before any model is touched. Returns ``stop`` as a list."""
    _require(_is_int(max_new_tokens) and max_new_tokens >= 1, "max_new_tokens", "an int >= 1", max_new_tokens)
    _require(max_len is None or _is_int(max_len) and max_len >= 1, "max_len", "None or an int >= 1", max_len)
    _require(_is_int(seed) and -2**63 <= seed < 2**64, "seed", "an int in [-2**63, 2**64)", seed)
    stop = [stop] if isinstance(stop, str) else stop
    _require(stop is None or isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop), "stop",
             "None, a string or a list of strings", stop)
    eos = [eos_token_id] if _is_int(eos_token_id) else eos_token_id
    _require(eos is None or isinstance(eos, (list, tuple)) and all(_is_int(t) and t >= 0 for t in eos),
             "eos_token_id", "None, an int >= 0 or a list of them", eos_token_id)
    if tokenizer is not None and not callable(getattr(tokenizer, "decode", None)):
        raise ValueError("tokenizer must be None or a tokenizer (with a decode method), got "
                         f"{type(tokenizer).__name__}")
    if dtype is not None:
        models.resolve_dtype(dtype, None)  # ValueError naming dtype
    for name, flag in (("compare_ar", compare_ar), ("record_steps", record_steps), ("logprobs", logprobs)):
        _require(isinstance(flag, bool), name, "a bool", flag)
    if stream is not None and not callable(stream):
        raise TypeError(f"stream must be a callable(b, token_ids), got {type(stream).__name__}")
    return stop


_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the caches and kernels take


def _check_weights(model, what, device=None):
    """Every parameter of ``model`` holds data (no meta tensors) on one device (``device``: the target's,
    for the draft) in a dtype the caches take (quantized weights are not parameters); metadata only."""
    for name, p in model.named_parameters():
        if p.device.type == "meta":
            raise ValueError(f"{what}: parameter {name} is on the meta device (no weights loaded); "
                             "load the model's weights first")
        if device is not None and p.device != device:
            raise ValueError(f"{what} must be on the target's device {device}, got parameter {name} on {p.device}")
        if p.is_floating_point() and p.dtype not in _WEIGHT_DTYPES:
            raise ValueError(f"{what}: parameter {name} has dtype {p.dtype}; the KV caches and kernels take "
                             "float32, float16 or bfloat16 models")


def _check_block_fits(drafter, method, max_len, limit):
    """A method's block that cannot fit the cache even after a one-token prompt is the method
    parameter's error (e.g. gamma=10**6), not the prompt's. The block at the configured budget
    (not the adaptive controller's cap, which a short cache only bounds)."""
    cap = max_len if max_len is not None else limit
    if cap is None:
        return
    param, rng = drafter.budget_param, drafter.adaptive_range  # rng: set only where param is
    cap_value = getattr(drafter, param) if param else None
    if rng is not None:
        drafter.set_budget(rng[0])  # the configured value, clamped into the controller's range
    budget, value = drafter.tree_budget(), (getattr(drafter, param) if param else None)
    if rng is not None:
        drafter.set_budget(cap_value)
    if budget + 2 <= cap:
        return
    named = f" ({param}={value!r})" if param else ""
    where = f"max_len={max_len}" if max_len is not None else f"the model's max_position_embeddings={limit}"
    raise ValueError(f"the {method} block{named} is too long for the cache: its {budget} rows plus one prompt "
                     f"token and one new token need {budget + 2} positions, the cache holds {where}")


def _check_tp_size(tp_size, target):
    """The TP degree to load a target by name or path with (1: unsharded)."""
    _require(tp_size is None or _is_int(tp_size) and tp_size >= 1, "tp_size", "None or an int >= 1", tp_size)
    if isinstance(target, torch.nn.Module):
        have = parallel.tp_size(target)
        if tp_size is not None and tp_size != have:
            raise ValueError(f"tp_size={tp_size} but the target model passed in is sharded over {have} rank(s); "
                             f"load it with DistributedConfig(tp_size={tp_size}) or leave tp_size=None")
        return have
    return parallel.env_world_size() if tp_size is None else tp_size


def runner_keywords(kv_layout, page_size, compile=False, compile_mode="default", linear="auto"):
    """The runner keywords for ``kv_layout`` / ``page_size`` / ``compile`` / ``linear`` (checked
    here, before any model work). Defaults pass none: they are every runner's defaults."""
    _require(isinstance(linear, str) and linear in LINEARS, "linear", f"one of {LINEARS}", linear)
    _require(isinstance(compile, bool), "compile", "a bool", compile)
    _require(isinstance(compile_mode, str), "compile_mode", "a torch.compile mode string", compile_mode)
    kw = {"compile": True, "compile_mode": compile_mode} if compile else {}
    _require(kv_layout in ("contiguous", "paged"), "kv_layout", "'contiguous' or 'paged'", kv_layout)
    _require(_is_int(page_size) and page_size >= 1 and not page_size & (page_size - 1), "page_size",
             "a power of two >= 1 (rows per KV page)", page_size)
    if kv_layout == "paged":
        kw.update(kv_layout="paged", page_size=page_size)
    if linear != "auto":
        kw["linear"] = linear
    return kw


# ---- input resolution ------------------------------------------------------------------------

_LOADED = {}  # (spec, dtype) -> (model, tokenizer): repeated calls by name reuse the loaded model
_LOADED_MAX = 4


def _resolve_model(spec, dtype, what, tp_size=1):
    if isinstance(spec, str):
        key = (spec, str(dtype), tp_size)
        if key not in _LOADED:
            try:
                loaded = models.load_any(spec, dtype, **({"tp_size": tp_size} if tp_size != 1 else {}))
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"{what}: {err}") from None
            if len(_LOADED) >= _LOADED_MAX:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = loaded
        return _LOADED[key]
    if isinstance(spec, torch.nn.Module) and hasattr(spec, "config"):
        return spec, getattr(spec, "specops_tokenizer", None)
    raise TypeError(f"{what} must be an HF causal LM, an embedded model name or a path, got {type(spec).__name__}")


def _vocab(model):
    out = model.get_output_embeddings()
    if getattr(out, "out_features", None) is not None:  # also int8 dynamic-quantized heads
        return int(out.out_features)
    if out is not None and isinstance(getattr(out, "weight", None), torch.Tensor):
        return int(out.weight.shape[0])
    return int(model.config.vocab_size)


# target tokenizer -> the draft tokenizers whose vocabularies were found equal to it: comparing two
# vocabularies (get_vocab() twice) took ~85 ms of every generate() call with a named draft.
_SAME_VOCAB = weakref.WeakKeyDictionary()


def _check_same_vocab(target, target_tok, draft, draft_tok):
    vt, vd = _vocab(target), _vocab(draft)
    if vt != vd:
        raise ValueError(f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt}); "
                         f"the draft must share the target's tokenizer")
    if target_tok is None or draft_tok is None or target_tok is draft_tok:
        return
    if len(target_tok) != len(draft_tok):  # (checked every call: added tokens change it)
        raise ValueError("the draft's tokenizer differs from the target's; the draft must share it")
    try:
        known = _SAME_VOCAB.setdefault(target_tok, weakref.WeakSet())
        if draft_tok in known:
            return
    except TypeError:  # a tokenizer that cannot be weakly referenced: compared every call
        known = None
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError("the draft's tokenizer differs from the target's; the draft must share it")
    if known is not None:
        known.add(draft_tok)


def _prompts(prompt, tokenizer):
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype not in (torch.int64, torch.int32) or prompt.dim() not in (1, 2):
            raise ValueError(f"a prompt tensor must be int64 [B, L] or [L], got {prompt.dtype} {tuple(prompt.shape)}")
        prompt = prompt[None] if prompt.dim() == 1 else prompt
        if prompt.shape[0] == 0:
            raise ValueError(f"prompt must hold at least one sequence, got a tensor of shape {tuple(prompt.shape)}")
        out = [row.tolist() for row in prompt]
    elif isinstance(prompt, (list, tuple)) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer: pass tokenizer= or use an embedded target")
            out = [tokenizer(p)["input_ids"] if p else [] for p in prompt]
        elif all(isinstance(p, (list, tuple)) and all(_is_int(t) for t in p) for p in prompt):
            out = [list(p) for p in prompt]
        elif all(isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p) for p in prompt):
            b, i = next((b, i) for b, p in enumerate(prompt) for i, t in enumerate(p) if isinstance(t, bool))
            raise ValueError(f"prompt token ids must be ints, not bools: got prompt[{b}][{i}] = {prompt[b][i]!r}")
        else:
            raise ValueError("prompt must be a string, a list of strings, a LongTensor or a list of token-id lists, "
                             f"got a list holding {sorted({type(p).__name__ for p in prompt})}")
    else:
        raise ValueError("prompt must be a non-empty string, list of strings, LongTensor or list of token-id lists, "
                         f"got {type(prompt).__name__} {prompt!r:.80}")
    for b, p in enumerate(out):
        if not p:
            raise ValueError(f"prompt {b} of the batch is empty; every prompt needs at least one token")
    return out


def _eos_ids(eos_token_id, model, tokenizer):
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return ()
    return (eos_token_id,) if isinstance(eos_token_id, int) else tuple(int(t) for t in eos_token_id)


def _pad_id(model, tokenizer):
    for src in (tokenizer, getattr(model, "generation_config", None), model.config):
        for attr in ("pad_token_id", "eos_token_id"):
            v = getattr(src, attr, None)
            if isinstance(v, (list, tuple)):
                v = v[0] if v else None
            if isinstance(v, int):
                return v
    return 0
