"""llguidance against xgrammar on the SmolLM2 tokenizer (docs/structured.md): grammar compile time,
mask time per token along a real token sequence, rollback / fork cost, per-node cost of a draft
tree's masks (specops.decoding.grammar), and JSON-schema feature coverage.

    python bench/grammar_engines.py [--steps 300] [--json OUT]

Needs the converted SmolLM2 cache (specops.models; nothing is downloaded) and either engine.
"""
import argparse
import json
import os
import statistics
import time

import torch

from specops import models
from specops.decoding.grammar import Grammar, available_engines

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": False,
        },
        "history": {"type": "array", "items": {
            "type": "object",
            "properties": {"year": {"type": "integer"}, "event": {"type": "string"},
                           "ok": {"type": "boolean"}},
            "required": ["year", "event", "ok"], "additionalProperties": False}},
    },
    "required": ["name", "age", "score", "role", "tags", "address", "history"],
    "additionalProperties": False,
}
DOC = {"name": "Ada Lovelace", "age": 36, "score": 98.25, "role": "admin", "tags": ["math", "engines", "poetry"],
       "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
       "history": [{"year": 1815 + i, "event": f"event number {i} of a long and eventful life", "ok": i % 2 == 0}
                   for i in range(12)]}
REGEX = r"(\d{4}-\d{2}-\d{2} [A-Z][a-z]+ [a-z]+ \d+(\.\d+)?\n){1,40}"
REGEX_TEXT = "".join(f"20{10 + i % 90:02d}-0{1 + i % 9}-1{i % 10} Item apples {i * 7}.{i % 10}\n" for i in range(40))
EBNF = r'''root ::= stmt+
stmt ::= ident " = " expr ";\n"
expr ::= term ((" + " | " - ") term)*
term ::= factor ((" * " | " / ") factor)*
factor ::= num | ident | "(" expr ")"
num ::= [0-9]+ ("." [0-9]+)?
ident ::= [a-z] [a-z0-9_]*
'''
EBNF_TEXT = "".join(f"x{i} = (a{i} + {i}.5) * b_{i} - c / {i + 1};\n" for i in range(30))

# JSON-schema features beyond the basics above, one schema each (compiles or not).
FEATURES = {
    "$ref/$defs": {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                   "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}},
    "recursive $ref": {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
                       "$ref": "#/$defs/n"},
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                        {"type": "object", "properties": {"b": {"type": "string"}}}]},
    "const": {"type": "object", "properties": {"v": {"const": "fixed"}}},
    "string pattern": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "format date-time": {"type": "string", "format": "date-time"},
    "format email": {"type": "string", "format": "email"},
    "min/maxLength": {"type": "string", "minLength": 3, "maxLength": 9},
    "min/maxItems": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5},
    "exclusiveMinimum (number)": {"type": "number", "exclusiveMinimum": 0.5},
    "integer min/max": {"type": "integer", "minimum": -5, "maximum": 1000},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "patternProperties": {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
    "additionalProperties schema": {"type": "object", "additionalProperties": {"type": "number"}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
    "if/then/else": {"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
    "not": {"not": {"type": "string"}},
    "type array": {"type": ["string", "null"]},
    "minProperties": {"type": "object", "minProperties": 1},
}


def tokenizer():
    return models.target_embedding("smollm2-135m")[1]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def mask_per_token(g, ids, steps):
    """Median seconds of one next-token mask along ``ids`` (commit after each)."""
    times = []
    for t in ids[:steps]:
        _, dt = timed(g.fill_next_bitmask)
        times.append(dt)
        g.advance([t])
    return statistics.median(times), len(times)


def draft_tree(ids, start, T, generator):
    """A draft tree over the true continuation: a chain of the next tokens (depth 6) with random
    siblings (half of them grammar-valid look-alikes: the true token of a nearby position)."""
    parents, tokens = [-1], [ids[start]]
    depth = {0: 0}
    while len(tokens) < T:
        i = len(tokens)
        if i <= 6:
            p = i - 1
            tokens.append(ids[start + i])
        else:
            p = int(torch.randint(0, i, (1,), generator=generator))
            near = ids[start + depth[p] + 1 + int(torch.randint(0, 3, (1,), generator=generator))]
            tokens.append(near if torch.rand(1, generator=generator) < 0.5 else
                          int(torch.randint(0, 49152, (1,), generator=generator)))
        parents.append(p)
        depth[i] = depth[p] + 1
    return torch.tensor([parents], dtype=torch.int32), torch.tensor([tokens], dtype=torch.int32)


def tree_cost(make, ids, T, reps):
    """Seconds per node of fill_tree_bitmask on T-node trees along the sequence."""
    g = make()
    gen = torch.Generator().manual_seed(T)
    per_node, valid = [], []
    g.advance([ids[0]])
    for k in range(reps):
        parents, tokens = draft_tree(ids, k, T, gen)
        (mask, ok), dt = timed(lambda: g.fill_tree_bitmask(parents, tokens, with_valid=True))
        per_node.append(dt / T)
        valid.append(int(ok.sum()))
        g.advance([ids[k + 1]])
    return statistics.median(per_node), statistics.mean(valid)


def engine_row(engine, tok, steps):
    row = {"engine": engine}
    cases = {"json_schema": (dict(json_schema=SCHEMA), json.dumps(DOC)), "regex": (dict(regex=REGEX), REGEX_TEXT),
             "ebnf": (dict(ebnf=EBNF), EBNF_TEXT)}
    _, row["tokenizer_setup_s"] = timed(lambda: Grammar(tok, regex="a", engine=engine))
    for kind, (spec, text) in cases.items():
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        compile_s = []
        for _ in range(3):
            _, dt = timed(lambda: Grammar(tok, engine=engine, **spec))
            compile_s.append(dt - row["tokenizer_setup_s"])
        make = lambda: Grammar(tok, engine=engine, **spec)  # noqa: E731
        g = make()
        mask_s, n = mask_per_token(g, ids, steps)
        terminated = g.is_terminated()[0] if n == len(ids) else None
        tree_s, tree_valid = tree_cost(make, ids, 24, min(40, len(ids) - 30))
        row[kind] = dict(compile_ms=1e3 * statistics.median(compile_s), mask_us=1e6 * mask_s, steps=n,
                         tokens=len(ids), terminated=terminated, tree24_us_per_node=1e6 * tree_s,
                         tree24_valid_nodes=tree_valid)
    row["rollback_us"], row["fork_us"] = fork_costs(engine, tok)
    row["schema_features"] = {name: compiles(tok, engine, s) for name, s in FEATURES.items()}
    return row


def fork_costs(engine, tok):
    g = Grammar(tok, json_schema=SCHEMA, engine=engine)
    ids = tok.encode(json.dumps(DOC), add_special_tokens=False)
    g.advance(ids[:40])
    m = g._matchers[0]  # noqa: SLF001 - a measurement of the engine object itself
    times = []
    for t in ids[40:140]:
        t0 = time.perf_counter()
        g.engine.consume(m, t)
        g.engine.rollback(m, 1)
        times.append(time.perf_counter() - t0)
        g.engine.consume(m, t)
    fork = m.deep_copy if engine == "llguidance" else m.fork
    forks = [timed(fork)[1] for _ in range(50)]
    return 1e6 * statistics.median(times), 1e6 * statistics.median(forks)


def compiles(tok, engine, schema):
    try:
        Grammar(tok, json_schema=schema, engine=engine)
        return True
    except ValueError as err:
        return str(err)[:160]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = tokenizer()
    rows = [engine_row(e, tok, args.steps) for e in available_engines()]
    out = {"load_average": os.getloadavg(), "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
