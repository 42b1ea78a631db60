"""specops.decoding.grammar on the SmolLM2 tokenizer: compile errors, tree masks against per-node
matchers, commit semantics, greedy masked decoding that yields parseable JSON; then generate(json_schema=
/ regex= / ebnf=) on SmolLM2: every method's output follows the grammar, greedy lossless methods give
AR's tokens (bf16, batch_invariant=True), the grammar's end stops a sequence, bad arguments raise
before any forward (docs/structured.md). Skips without a grammar engine (pip install specops[grammar])
or the converted SmolLM2 (nothing is downloaded)."""
import json
import os
import re

import pytest
import torch

import specops
from specops import models
from specops.decoding.grammar import ENGINES, Grammar, available_engines
from specops.ops.token_bitmask import allowed_tokens, apply_token_bitmask
from specops.testing import tiny_causal_lm

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
                         "kind": {"enum": ["a", "b"]},
                         "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
                         "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                   "required": ["ok"], "additionalProperties": False}},
          "required": ["name", "n", "kind", "xs", "inner"], "additionalProperties": False}
DOC = '{"name": "abc", "n": 12, "kind": "b", "xs": [1.5, 2], "inner": {"ok": true}}'


def check_doc(text):
    """``text`` is a JSON document that SCHEMA validates."""
    doc = json.loads(text)
    assert set(doc) == set(SCHEMA["required"]) and doc["kind"] in ("a", "b") and isinstance(doc["n"], int)
    assert len(doc["name"]) <= 12 and len(doc["xs"]) <= 3 and isinstance(doc["inner"]["ok"], bool)


@pytest.fixture(scope="module")
def tok():
    if not os.path.exists(os.path.join(models.cache_dir(), "smollm2-135m", "tokenizer.json")):
        pytest.skip("SmolLM2 not converted in the specops cache (specops.models.load('smollm2-135m') once)")
    return models.target_embedding("smollm2-135m")[1]


@pytest.fixture(params=[pytest.param(e, marks=() if e in available_engines() else pytest.mark.skip(
    reason=f"{e} not installed (pip install specops[grammar])")) for e in ENGINES])
def engine(request):
    return request.param


def ids_of(tok, text):
    return tok.encode(text, add_special_tokens=False)


# ---- construction ---------------------------------------------------------------------------

BAD_SPECS = [  # (Grammar keywords, error, message; {engine}: the engine under test)
    ({}, ValueError, "exactly one of json_schema, regex, ebnf"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, ValueError, "exactly one of json_schema, regex, ebnf"),
    ({"json_schema": '{"type": "object", "properties": '}, ValueError,
     "json_schema does not compile with {engine}: .+"),
    ({"regex": "(ab"}, ValueError, "regex does not compile with {engine}: .+"),
    ({"ebnf": "root ::= missing_rule"}, ValueError, "ebnf does not compile with {engine}: .+"),
    ({"regex": 5}, TypeError, "regex must be a str"),
    ({"regex": "a", "engine": "outlines"}, ValueError, "engine must be one of"),
]


def test_bad_specs_raise_naming_the_argument(tok, engine):
    for kw, error, match in BAD_SPECS:
        with pytest.raises(error, match=match.format(engine=engine)):
            Grammar(tok, **{"engine": engine, **kw})


def test_padding_columns_are_disallowed(tok, engine):
    g = Grammar(tok, regex="[a-z]+", vocab_size=len(tok) + 40, engine=engine)
    rows = g.fill_next_bitmask()
    assert rows.shape == (1, (len(tok) + 40 + 31) // 32)
    assert not allowed_tokens(rows, len(tok) + 40)[0, len(tok):].any()


# ---- masks ------------------------------------------------------------------------------------

def test_next_mask_follows_the_grammar(tok, engine):
    g = Grammar(tok, regex="yes|no", engine=engine)
    allowed = allowed_tokens(g.fill_next_bitmask(), len(tok))[0].nonzero().flatten().tolist()
    texts = {tok.decode([t]) for t in allowed}
    assert texts and all("yes".startswith(s) or "no".startswith(s) for s in texts), texts
    assert tok.eos_token_id not in allowed
    g.advance(ids_of(tok, "yes"))
    assert allowed_tokens(g.fill_next_bitmask(), len(tok))[0, tok.eos_token_id] and not g.is_terminated()[0]
    g.advance([tok.eos_token_id])
    assert g.is_terminated() == [True]


def test_tree_rows_equal_per_node_matchers(tok, engine):
    """Every valid node's row is the next mask of a fresh matcher fed the node's path."""
    committed = ids_of(tok, '{"name": "abc", "n": 1')
    cont = ids_of(tok, '2, "kind": "b", "xs": [1.5, 2], "inner": {"ok": true}}')
    dead = ids_of(tok, " hello")[0]  # a word right after a digit: never JSON
    # 0 = root (committed[-1]); a chain of the true continuation, a dead sibling at depth 1,
    # a child of the dead sibling (dead too), a duplicate branch at depth 2, one at depth 1.
    parents = [-1, 0, 1, 2, 3, 0, 5, 1, 0]
    tokens = [committed[-1], cont[0], cont[1], cont[2], cont[3], dead, cont[0], cont[1], cont[0]]
    g = Grammar(tok, json_schema=SCHEMA, engine=engine, batch_size=2)
    g.advance([committed, committed[:3]])
    par = torch.tensor([parents, [-1, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    toks = torch.tensor([tokens, [committed[2], committed[3], committed[4], 7, 7, 7, 7, 7, 7]], dtype=torch.int32)
    mask, valid = g.fill_tree_bitmask(par, toks, torch.tensor([9, 4], dtype=torch.int32), with_valid=True)
    assert mask.shape == (2, 9, g.words) and mask.dtype == torch.int32
    assert valid[0].tolist() == [True, True, True, True, True, False, False, True, True]
    assert valid[1, :2].tolist() == [True, True] and not valid[1, 4:].any()
    cases = [(parents, tokens, 9, committed), (par[1].tolist(), toks[1].tolist(), 4, committed[:3])]
    for b, (p, t, n, base) in enumerate(cases):
        for i in range(n):
            if not valid[b, i]:
                assert (mask[b, i] == -1).all() or i >= n
                continue
            path, j = [], i
            while j > 0:
                path.append(t[j])
                j = p[j]
            ref = Grammar(tok, json_schema=SCHEMA, engine=engine)
            ref.advance(base + path[::-1])
            assert torch.equal(mask[b, i], ref.fill_next_bitmask()[0]), (b, i)
    # the committed states did not move: the next mask is still that of node 0
    assert torch.equal(g.fill_next_bitmask(), mask[:, 0])
    with pytest.raises(ValueError, match=r"accepted_tokens\[0\]\[0\] = .* is not allowed"):
        g.advance([[tokens[5]], []])


def test_bad_tree_input(tok, engine):
    g = Grammar(tok, regex="a+", engine=engine)
    with pytest.raises(ValueError, match=r"tokens must have shape \[1, 3\]"):
        g.fill_tree_bitmask(torch.tensor([[-1, 0, 1]]), torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="B = batch_size = 1"):
        g.fill_tree_bitmask(torch.tensor([[-1], [-1]]), torch.tensor([[1], [1]]))
    with pytest.raises(ValueError, match=r"parents\[0, 2\] must satisfy -1 < parent < 2"):
        g.fill_tree_bitmask(torch.tensor([[-1, 0, 2]]), torch.tensor([[1, 2, 3]]))


def test_constrain_prunes_rejected_candidates_and_appends_forced_tokens(tok, engine):
    g = Grammar(tok, json_schema=SCHEMA, engine=engine)
    prefix = ids_of(tok, '{"name": "abc", "n')
    g.advance(prefix)
    good = ids_of(tok, '": 1')  # a valid continuation
    bad = ids_of(tok, ' hello')  # not JSON here
    tokens = [prefix[-1]] + good + bad
    parents = [-1] + list(range(len(good))) + [0] + list(range(len(good) + 1, len(good) + len(bad)))
    out_t, out_p = g.constrain(0, tokens, parents, forced=0)
    assert out_t == [prefix[-1]] + good and out_p == [-1] + list(range(len(good)))
    # Forced tokens after the surviving leaf: every one the grammar accepts along the chain, and the
    # committed state is untouched (the full tree's masks are those of a fresh walk).
    before = g.fill_next_bitmask()
    ext_t, ext_p = g.constrain(0, [prefix[-1]], [-1], forced=8)
    assert all(ext_p[i] == i - 1 for i in range(1, len(ext_t)))
    assert torch.equal(g.fill_next_bitmask(), before)
    check = Grammar(tok, json_schema=SCHEMA, engine=engine)
    check.advance(prefix + ext_t[1:])  # raises if a forced token is not allowed
    if engine == "xgrammar":  # after '"n' the schema forces '":' (the key is complete)
        assert tok.decode(ext_t[1:]).startswith('":'), tok.decode(ext_t[1:])
    with pytest.raises(ValueError, match="b must be in"):
        g.constrain(1, tokens, parents)
    with pytest.raises(ValueError, match=r"parents\[2\] must satisfy"):
        g.constrain(0, [1, 2, 3], [-1, 0, 2])


def test_rows_after_paths_equal_the_tree_rows(tok, engine):
    """A model drafter's masks (allowed tokens after each drafted path) are the rows the tree walk
    gives the same nodes; a rejected path allows everything; the committed state is unchanged."""
    g = Grammar(tok, json_schema=SCHEMA, engine=engine)
    doc = ids_of(tok, DOC)
    g.advance(doc[:3])
    chain = doc[3:9]
    tree = g.fill_tree_bitmask(torch.tensor([[-1] + list(range(len(chain)))], dtype=torch.int32),
                               torch.tensor([[doc[2]] + chain], dtype=torch.int32))[0]  # [7, W]
    before = g.fill_next_bitmask()
    rows = g.rows_after([(0, chain[:i]) for i in range(len(chain) + 1)] + [(0, ids_of(tok, " hello"))])
    assert torch.equal(rows[:-1], tree)
    assert bool((rows[-1] == -1).all()) or bool((rows[-1][:-1] == -1).all())  # all allowed (tail bits cleared)
    assert torch.equal(g.fill_next_bitmask(), before)


# ---- decoding -------------------------------------------------------------------------------

def greedy(g, tok, logits_fn, max_tokens=120):
    """Greedy decoding of one sequence under the grammar, from made-up logits: a draft tree of a
    chain of the next 3 argmax guesses is masked, verified greedily against the masked rows, and
    the accepted path plus the bonus token committed (the loop's order of work)."""
    out = [int(apply_token_bitmask(logits_fn([])[None], g.fill_next_bitmask()).argmax())]
    g.advance(out)
    while not g.is_terminated()[0] and len(out) < max_tokens:
        # drafts: the unmasked argmax chain (often off-grammar: the mask must prune it)
        chain = [out[-1]]
        for _ in range(3):
            chain.append(int(logits_fn(out + chain[1:]).argmax()))
        mask = g.fill_tree_bitmask(torch.tensor([[-1, 0, 1, 2]], dtype=torch.int32),
                                   torch.tensor([chain], dtype=torch.int32))  # [1, 4, W]
        rows = torch.stack([logits_fn(out + chain[1:i + 1]) for i in range(4)])[None]  # [1, 4, V]
        apply_token_bitmask(rows, mask)
        accepted = []
        for i in range(4):
            accepted.append(int(rows[0, i].argmax()))
            if i == 3 or chain[i + 1] != accepted[-1] or accepted[-1] == tok.eos_token_id:
                break  # that was the bonus / correction token
        g.advance([accepted])
        out += accepted
    return out


def noise_model(tok, seed, rows, eos_bonus, blank=0.0):
    """A fixed pseudo-random "model": the logits depend on the prefix length only (one of ``rows``
    rows), the end token gets ``eos_bonus(len(prefix))`` and whitespace-only tokens ``blank``."""
    noise = torch.randn(rows, len(tok), generator=torch.Generator().manual_seed(seed))
    if blank:
        noise[:, torch.tensor([tok.decode([t]).strip() == "" for t in range(len(tok))])] += blank

    def logits_fn(prefix):
        row = noise[len(prefix) % rows].clone()
        row[tok.eos_token_id] += eos_bonus(len(prefix))
        return row
    return logits_fn


def test_greedy_masked_decoding_gives_valid_json(tok, engine):
    # The end token favoured late, so the grammar has to steer every choice; whitespace is free
    # between JSON tokens: the made-up model must not spend its budget there.
    logits_fn = noise_model(tok, 0, 4096, lambda n: 4.0 if n > 40 else -4.0, blank=-8.0)
    g = Grammar(tok, json_schema=SCHEMA, engine=engine)
    out = greedy(g, tok, logits_fn, max_tokens=400)
    assert g.is_terminated() == [True] and out[-1] == tok.eos_token_id, tok.decode(out)
    check_doc(tok.decode(out[:-1]))


def test_greedy_masked_decoding_matches_regex(tok, engine):
    g = Grammar(tok, regex=r"[0-9]{3}-[a-z]{2,4}", engine=engine)
    out = greedy(g, tok, noise_model(tok, 1, 512, lambda n: 6.0))
    assert out[-1] == tok.eos_token_id
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", tok.decode(out[:-1]))


# ---- generate under a grammar, on SmolLM2 ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(tok):  # tok: skips without the converted SmolLM2
    if not available_engines():
        pytest.skip("no grammar engine (pip install specops[grammar])")
    model = models.load("smollm2-135m", dtype=torch.bfloat16)[0]
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
