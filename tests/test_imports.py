"""The import doors between the rooms, checked on the source: ops <- engine <- decoding, never
upward, no import cycle, training code (specops.distill) out of the runtime; and what ``import
specops`` of an install must get right.

Every module of specops/ and specops.triton_kernels (setup.py maps it from triton_kernels/) is
parsed; every import counts, in functions too (a deferred edge, not a missing one). ``from pkg
import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. The implicit
import of parent packages is not an edge (every package would be in a cycle with its children)."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"specops": ROOT / "specops", "specops.triton_kernels": ROOT / "triton_kernels"}

# (importer prefix, imported prefix, why): an import from a module under the first into one under the
# second breaks the layering (docs: README §Source map; house rule ops <- engine <- decoding).
FORBIDDEN = [
    *(("specops.ops", f"specops.{up}", "ops/ is stateless: it imports nothing above it")
      for up in ("engine", "decoding", "cache", "integrations")),
    ("specops.engine", "specops.decoding", "the engine is driven by decoding/, never the reverse"),
    ("specops.engine", "specops.integrations", "integrations/ holds aliases of engine names"),
    ("specops.engine", "specops.cache", "specops.cache is an alias package of specops.engine.cache"),
    ("specops.engine", "specops.distill", "training code stays out of the runtime"),
    ("specops.engine", "specops.cli", "the engine is a library"),
]


def _module_files():
    mods = {}
    for pkg, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            is_pkg = parts[-1] == "__init__"
            mods[".".join((pkg, *parts[:len(parts) - is_pkg]))] = (path, is_pkg)
    return mods


MODULES = _module_files()


def _resolve(importer, is_pkg, node):
    """The specops modules one import node reaches (relative imports resolved against ``importer``)."""
    if isinstance(node, ast.Import):
        found = []
        for name in (a.name for a in node.names):
            while name and name not in MODULES:  # ``import specops.x.y`` where y is an attribute
                name = name.rpartition(".")[0]
            found += [name] if name else []
        return found
    if node.level:
        parts = importer.split(".")
        pkg = ".".join(parts[:len(parts) + is_pkg - node.level])
        base = f"{pkg}.{node.module}" if node.module else pkg
    else:
        base = node.module or ""
    if base not in MODULES:  # not specops', or a generated module (specops._build_info, written by the build)
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _edges():
    """[(importer, imported, at_module_level, line)] for every import of a specops module."""
    edges = []
    for mod, (path, is_pkg) in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        nested = {n for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top = node not in nested
                for target in _resolve(mod, is_pkg, node):
                    if target != mod:
                        edges.append((mod, target, top, node.lineno))
    return edges


EDGES = _edges()


def _cycles(edges):
    """The strongly connected components of more than one module, each a sorted list."""
    graph, reach = {}, {}
    for a, b, _, _ in edges:
        graph.setdefault(a, set()).add(b)
    for v in graph:
        seen, todo = set(), [v]
        while todo:
            new = graph.get(todo.pop(), set()) - seen
            seen |= new
            todo += new
        reach[v] = seen
    comps = {tuple(sorted(w for w in reach[v] if v in reach.get(w, ()))) for v in graph if v in reach[v]}
    return sorted(list(c) for c in comps)


def _under(mod, prefix):
    return mod == prefix or mod.startswith(prefix + ".")


def _where(a, b):
    return ", ".join(f"{a}:{line}{'' if top else ' (in a function)'}" for x, y, top, line in EDGES
                     if (x, y) == (a, b))


def _listing(pairs):
    return "; ".join(f"{a} -> {b} ({_where(a, b)})" for a, b in pairs)


def test_every_module_parses_and_the_walk_sees_the_rooms():
    # a walk that found nothing would pass every check below; it reaches into the op folders too
    for mod in ("ops.tree_attention.plan", "engine.runner", "engine.attention", "engine.compiled",
                "engine.cache.base", "decoding.loop", "ops.tree_attention", "ops.tree_attention.ref",
                "ops.kv_compact.plan", "ops.verify.logits", "ops.linear.ref", "distill.train"):
        assert f"specops.{mod}" in MODULES, mod
    assert any(a == "specops.decoding.loop" and b == "specops.engine" for a, b, _, _ in EDGES)
    assert any(a == "specops" and b == "specops.decoding.api" and not top for a, b, top, _ in EDGES)


def test_no_import_cycle_between_specops_modules():
    cycles = _cycles(EDGES)
    assert not cycles, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + ": " + _listing(sorted({(a, b) for a, b, _, _ in EDGES if a in c and b in c}))
        for c in cycles)


@pytest.mark.parametrize("src, dst, why", FORBIDDEN, ids=[f"{s}->{d}" for s, d, _ in FORBIDDEN])
def test_no_upward_import(src, dst, why):
    bad = sorted({(a, b) for a, b, _, _ in EDGES if _under(a, src) and _under(b, dst)})
    assert not bad, f"{why}: " + _listing(bad)


def test_no_runtime_module_imports_distill_at_module_level():
    # Only the distill package itself and the CLI's subcommand (a function-level import) load training code.
    bad = sorted({(a, b) for a, b, top, _ in EDGES
                  if top and _under(b, "specops.distill") and not _under(a, "specops.distill")})
    assert not bad, "runtime modules importing specops.distill at module level: " + _listing(bad)


# ---- the same at run time: what each user path actually loads (issue #32) -----------------------

_GENERATE = ("import specops; from specops.testing import tiny_causal_lm\n"
             "specops.generate(tiny_causal_lm('llama', seed=0), [[1, 2, 3, 4]], method='ngram',"
             " max_new_tokens=4, eos_token_id=[]{})\n")
_RUNS = {
    "import specops": "import specops",
    "specops info": "from specops import cli; cli.main(['info'])",
    "generate eager": _GENERATE.format(""),
    # compiled: its step's modules load (torch.compile is stubbed to eager tracing, not what this checks)
    "generate compiled": ("import torch\n"
                          "torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)\n"
                          + _GENERATE.format(", compile=True")
                          + "import sys; assert 'specops.engine.compiled' in sys.modules"),
}


@pytest.mark.parametrize("path", list(_RUNS))
def test_user_paths_load_no_training_code(path):
    code = _RUNS[path] + "\nimport sys\nprint('LOADED', sorted(m for m in sys.modules if m.startswith('specops.distill')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("LOADED")][-1]
    assert line == "LOADED []", f"{path} loaded training code: {line}"
    if path == "specops info":
        assert "backend" in done.stdout  # the command ran


# ---- an install built against another torch fails at import, saying so and how to rebuild ---------

def test_extensions_built_against_another_torch_fail_clearly_at_import():
    code = ("import sys, types; m = types.ModuleType('specops._build_info'); "
            "m.TORCH_VERSION = '2.0.0+other'; sys.modules['specops._build_info'] = m; import specops")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert (f"built against torch 2.0.0+other, but torch {torch.__version__} is installed" in proc.stderr
            and "--no-build-isolation" in proc.stderr), proc.stderr[-2000:]


def test_the_installed_build_records_this_torch():
    from specops import _build_info

    assert _build_info.TORCH_VERSION == torch.__version__


# ---- no private name crosses a module boundary in ops/ (issue #31) -------------------------------

def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_crossings(tree):
    """[(line, what)] where a module reaches a ``_name`` another module defines: a private module in
    an import's path (``from .. import _x``, ``from ._x import y``, ``import a._x``), a private name
    imported (``from .x import _y``, however bound), a private attribute of a name an import binds
    anywhere in the file (``mod._y``, ``mod.sub._y``; a shadowing local counts as the import). Dunder
    names are not private. Unseen: ``getattr(mod, "_y")``, private names of returned values."""
    found, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if any(_is_private(p) for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            src = "." * node.level + (node.module or "")
            if any(_is_private(p) for p in (node.module or "").split(".")):
                found.append((node.lineno, f"from {src} import ... (a private module)"))
            for alias in node.names:
                if _is_private(alias.name):
                    found.append((node.lineno, f"from {src} import {alias.name}"))
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            # only the outermost attribute of a chain reports (its inner ones are walked too)
            if isinstance(base, ast.Name) and base.id in bound and _is_private(node.attr):
                found.append((node.lineno, ".".join([base.id] + chain[::-1])))
    return sorted(set(found))


def test_the_private_name_scan_sees_each_kind_of_crossing():
    # a scan that found nothing would pass the test below
    src = ("from .. import _ext\nfrom ._checks import tensor\nfrom .tree_attention import _has_op as h, public\n"
           "import specops._ext\nfrom . import kv_compact as kvc, __version__\n"
           "def f():\n    from . import plan\n    return kvc._check_values, plan.sub._x, kvc.__doc__, public\n"
           "class _Local:\n    pass\n_local = _Local()._hidden\n")
    got = [what for _, what in _private_crossings(ast.parse(src))]
    assert got == ["from .. import _ext", "from ._checks import ... (a private module)",
                   "from .tree_attention import _has_op", "import specops._ext", "kvc._check_values",
                   "plan.sub._x"], got


def test_no_private_name_crosses_a_module_boundary_in_ops():
    """A module under specops/ops/ uses only other modules' public names (specops' and third
    parties'): what they share with it is their public API, renamed or removed only with its users
    in view (what counts: :func:`_private_crossings`)."""
    bad = []
    for mod, (path, _) in sorted(MODULES.items()):
        if _under(mod, "specops.ops"):
            tree = ast.parse(path.read_text(), filename=str(path))
            bad += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _private_crossings(tree)]
    assert not bad, "private names crossing a module boundary in ops/ (make them public):\n" + "\n".join(bad)


# ---- one folder per op (issue #31) ------------------------------------------------------------------

OPS_SHARED = {"__init__", "checks", "layout"}  # what every op shares: the rule vocabulary, KvLayout


def test_every_op_is_a_folder_with_its_reference():
    """specops/ops/ holds the shared modules and one folder per op stem, each with ``__init__.py``
    (entry, contract, checks, registrations) and ``ref.py`` (the torch reference)."""
    ops = ROOT / "specops" / "ops"
    loose = sorted(p.stem for p in ops.glob("*.py") if p.stem not in OPS_SHARED)
    assert not loose, f"modules outside an op folder in specops/ops/ (move them into their op's folder): {loose}"
    folders = sorted(p for p in ops.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {p.name for p in folders} >= {"tree_attention", "kv_compact", "verify", "sampling", "topn", "tree_mask",
                                         "token_bitmask", "linear"}
    missing = [f"{p.name}/{f}" for p in folders for f in ("__init__.py", "ref.py") if not (p / f).is_file()]
    assert not missing, f"op folders without their entry or torch reference: {missing}"
