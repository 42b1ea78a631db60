"""generate(json_schema= / regex= / ebnf=): every method's output follows the grammar, greedy lossless
methods give AR's tokens under it (bf16 with batch_invariant=True), the grammar's end stops a
sequence, bad arguments raise before any forward (docs/structured.md). Skips without a grammar
engine (pip install specops[grammar]) or the converted SmolLM2 (nothing is downloaded)."""
import json
import re

import pytest
import torch
from test_grammar import SCHEMA, check_doc, skip_without_smollm2

import specops
from specops import models
from specops.decoding.grammar import available_engines
from specops.testing import tiny_causal_lm

pytestmark = pytest.mark.skipif(not available_engines(), reason="no grammar engine (pip install specops[grammar])")


@pytest.fixture(scope="module")
def smollm2():
    skip_without_smollm2()
    model, tok = models.load("smollm2-135m", dtype=torch.bfloat16)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Describe a cat as a JSON object."}],
                                     tokenize=False, add_generation_prompt=True)
    return model, tok, prompt


def test_every_method_follows_a_json_schema_and_lossless_ones_give_ar_tokens(smollm2):
    model, tok, prompt = smollm2
    kw = {"tokenizer": tok, "max_new_tokens": 120, "json_schema": SCHEMA, "batch_invariant": True}
    ar, m = specops.generate(model, prompt, method="ar", **kw)
    text = tok.decode(ar[0, : m.lengths[0]], skip_special_tokens=True)
    check_doc(text)
    assert m.finish_reasons == ["eos"]  # the grammar's end stopped it
    for method in ("ngram", "sd", "tsd", "specinfer", "opt-tree", "ouroboros"):
        out, mm = specops.generate(model, prompt, method=method, **kw)
        assert out.tolist() == ar.tolist(), method
        assert mm.num_target_forwards < mm.num_generated_tokens  # blocks were verified


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_the_other_methods_follow_the_schema_greedy_and_sampled(smollm2, temperature):
    # gsd and mjsd are not lossless (no identity to AR) and the lossless ones sampled have no fixed
    # output: each must still produce a document that validates.
    model, tok, prompt = smollm2
    methods = ("gsd", "mjsd") if temperature == 0 else \
        ("ar", "ngram", "sd", "tsd", "gsd", "specinfer", "opt-tree", "ouroboros", "mjsd")
    for method in methods:
        out, m = specops.generate(model, prompt, method=method, tokenizer=tok, max_new_tokens=120,
                                  json_schema=json.dumps(SCHEMA), temperature=temperature, seed=5)
        check_doc(tok.decode(out[0, : m.lengths[0]], skip_special_tokens=True))
        assert m.finish_reasons == ["eos"], method


def test_regex_with_sampling_and_a_batch(smollm2):
    model, tok, prompt = smollm2
    out, m = specops.generate(model, [prompt, prompt + "Sure"], method="ngram", tokenizer=tok, max_new_tokens=24,
                              regex=r"(yes|no), [0-9]{2,4}", temperature=0.9, seed=3)
    for b in range(2):
        text = tok.decode(out[b, : m.lengths[b]], skip_special_tokens=True)
        assert re.fullmatch(r"(yes|no), [0-9]{2,4}", text), text


def test_ebnf_and_the_first_token_is_masked(smollm2):
    model, tok, prompt = smollm2
    out, m = specops.generate(model, prompt, method="ar", tokenizer=tok, max_new_tokens=8,
                              ebnf='root ::= "ZZ" [0-9]')
    assert re.fullmatch(r"ZZ[0-9]", tok.decode(out[0, : m.lengths[0]], skip_special_tokens=True))


def test_bad_grammar_arguments_raise_before_work(smollm2, monkeypatch):
    model, tok, prompt = smollm2
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="exactly one of json_schema, regex, ebnf"):
        specops.generate(model, prompt, tokenizer=tok, regex="a", ebnf='root ::= "a"')
    with pytest.raises(ValueError, match="regex does not compile"):
        specops.generate(model, prompt, tokenizer=tok, regex="(ab")
    with pytest.raises(ValueError, match="grammar_engine is for json_schema"):
        specops.generate(model, prompt, tokenizer=tok, grammar_engine="xgrammar")
    assert not calls
    with pytest.raises(ValueError, match="need a tokenizer"):
        specops.generate(tiny_causal_lm(), [[1, 2, 3]], regex="a")
