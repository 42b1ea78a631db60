"""Question files for ``bench/bench_decoding.py --questions FILE``: the JSON-lines format of the
field's speculative-decoding benchmarks, one question per line::

    {"question_id": 81, "category": "translation", "turns": ["Translate ... into German.", "..."]}

``question_id`` (a string or an integer, unique in the file), ``category`` (a non-empty string
without commas: it becomes the benchmark's task) and ``turns`` (a non-empty list of non-empty
strings: the user turns) are required; other fields (e.g. ``reference``) are ignored. Only the
first turn is decoded: it is the prompt, formatted with the target's chat template. Blank lines
are skipped. The repository ships no third-party questions; bring your own file.

Also the per-category table that ``bench_decoding`` prints after a run (from its CSV rows).
"""
import dataclasses
import json

REQUIRED = ("question_id", "category", "turns")


@dataclasses.dataclass(frozen=True)
class Question:
    question_id: object  # str or int, as in the file
    category: str
    turns: tuple  # of str; turns[0] is the prompt
    line: int  # 1-based line number in the file (for messages)


def _kind(value):
    return type(value).__name__ if value is not None else "null"


def parse(lines, source="<questions>"):
    """{category: [Question, ...]} in file order (categories in order of first appearance).

    Raises ValueError naming ``source``, the line number and the field for a line that is not a JSON
    object, a missing or ill-typed field, or a repeated question_id; and for a file without questions."""
    out, seen = {}, {}
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{source} line {n}"
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object with fields {list(REQUIRED)}, got {_kind(item)}")
        for field in REQUIRED:
            if field not in item:
                raise ValueError(f"{where}: field {field!r} is missing (required: {list(REQUIRED)})")
        qid, category, turns = item["question_id"], item["category"], item["turns"]
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            raise ValueError(f"{where}: field 'question_id' must be a string or an integer, got {_kind(qid)} {qid!r}")
        if not isinstance(category, str) or not category.strip() or "," in category:
            raise ValueError(f"{where}: field 'category' must be a non-empty string without commas, "
                             f"got {_kind(category)} {category!r}")
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: field 'turns' must be a non-empty list of strings, got {_kind(turns)} "
                             f"{str(turns)[:60]}")
        for i, turn in enumerate(turns):
            if not isinstance(turn, str) or not turn.strip():
                raise ValueError(f"{where}: field 'turns'[{i}] must be a non-empty string, got {_kind(turn)} "
                                 f"{str(turn)[:60]!r}")
        if qid in seen:
            raise ValueError(f"{where}: field 'question_id' {qid!r} repeats line {seen[qid]}")
        seen[qid] = n
        out.setdefault(category, []).append(Question(qid, category, tuple(turns), n))
    if not out:
        raise ValueError(f"{source}: no questions (expected one JSON object per line)")
    return out


def load(path, categories=None, per_category=None):
    """Reads and validates ``path`` (see :func:`parse`); keeps ``categories`` (all if None, else
    in the given order) and the first ``per_category`` questions of each (all if None)."""
    if per_category is not None and (isinstance(per_category, bool) or not isinstance(per_category, int)
                                     or per_category < 1):
        raise ValueError(f"per_category must be a positive integer or None, got {per_category!r}")
    with open(path, encoding="utf-8") as f:
        spec = parse(f, source=str(path))
    if categories is not None:
        unknown = [c for c in categories if c not in spec]
        if unknown:
            raise ValueError(f"categories {unknown} are not in {path}; it has {list(spec)}")
        spec = {c: spec[c] for c in categories}
    return {c: qs[:per_category] for c, qs in spec.items()}


def encode(tokenizer, questions):
    """{category: [token ids of the first turn, ...]}: the turn as one user message through the
    tokenizer's chat template with the generation prompt (the assistant header) appended. A
    tokenizer without a template (a base model) gets the plain text with its special tokens."""
    out = {}
    for category, qs in questions.items():
        ids = []
        for q in qs:
            if tokenizer.chat_template:
                text = tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}], tokenize=False,
                                                     add_generation_prompt=True)
                # the template already wrote any BOS; the tokenizer must not add a second one
                ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            else:
                ids.append(tokenizer(q.turns[0], add_special_tokens=True)["input_ids"])
        out[category] = ids
    return out


def table(rows):
    """Plain text, one block per (target, sampling, batch, task/category) of ``rows`` (Recorder rows
    of bench_decoding): every provider's tok/s, speedup vs AR, mean acceptance length and speedup
    vs the best HF peer, in run order; then the best HF peer and the best method against it."""
    cases, skips = {}, []
    for r in rows:
        if r["provider"] == "machine":
            continue
        p = json.loads(r["params"] or "{}")
        if r["metric"] == "skipped":
            skips.append(f"# skipped {r['provider']} ({r['case']}): {r['unit']}")
            continue
        key = (p.get("target"), p.get("mode"), p.get("batch"), p.get("task"))
        case = cases.setdefault(key, {"params": p, "providers": {}})
        case["providers"].setdefault(r["provider"], {})[r["metric"]] = r["p50"]
    lines = []
    for (target, mode, batch, task), case in cases.items():
        p, prov = case["params"], case["providers"]
        lines.append(f"## {target}, {mode}, batch {batch}, {task}: {p.get('prompts')} prompt(s), "
                     f"{p.get('new_tokens')} new tokens")
        lines.append(f"{'provider':<18} {'tok/s':>8} {'vs AR':>7} {'MAL':>6} {'vs best HF':>10}")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for name, m in prov.items():
            lines.append(f"{name:<18} {fmt(m.get('tokens_per_s'), '8.1f')} "
                         f"{fmt(m.get('speedup_vs_ar'), '6.2f') + ('x' if 'speedup_vs_ar' in m else ''):>7} "
                         f"{fmt(m.get('mean_acceptance_length'), '6.2f'):>6} "
                         f"{fmt(m.get('speedup_vs_best_hf'), '9.2f') + ('x' if 'speedup_vs_best_hf' in m else ''):>10}")
        peers = {n: m["tokens_per_s"] for n, m in prov.items() if n.startswith("hf_") and "tokens_per_s" in m}
        ours = {n: m["tokens_per_s"] for n, m in prov.items() if not n.startswith("hf_") and n != "ar"
                and "tokens_per_s" in m}
        ar = prov.get("ar", {}).get("tokens_per_s")
        summary = f"AR {fmt(ar, '.1f')} tok/s"
        if peers:
            hf = max(peers, key=peers.get)
            summary += f"; best HF peer {hf} {peers[hf]:.1f} tok/s"
        if ours:
            best = max(ours, key=ours.get)
            summary += f"; best method {best} {ours[best]:.1f} tok/s"
            if ar:
                summary += f" = {ours[best] / ar:.2f}x AR"
            if peers:
                summary += f", {ours[best] / peers[hf]:.2f}x the best HF peer"
        lines.append("# " + summary)
        lines.append("")
    return "\n".join(lines + skips).rstrip("\n")
