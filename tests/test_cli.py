"""``python -m specops`` is the ``specops`` command: same subcommands, same exit codes; alone it
prints the backend report."""
import json
import subprocess
import sys

import pytest

from specops import cli, models

HELP = ["generate", "demo", "distill", "info"]
# Run in one fresh interpreter the way -m runs a package (runpy, its __main__ as "__main__"), one
# argv after the other: one interpreter start (~5 s here) instead of one per case.
RUNS = """
import contextlib, io, json, runpy, sys
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["specops", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("specops", run_name="__main__", alter_sys=True)
            code = None
        except SystemExit as exit:
            code = exit.code
    done.append((code, out.getvalue(), err.getvalue()))
print(json.dumps(done))
"""


@pytest.fixture(scope="module")
def module():
    """argv (a tuple) -> (exit code, stdout, stderr) of ``python -m specops *argv``."""
    argvs = [[], *([c, "--help"] for c in HELP), ["warp-drive"]]
    p = subprocess.run([sys.executable, "-c", RUNS, json.dumps(argvs)], capture_output=True, text=True, timeout=300,
                       check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return {tuple(a): tuple(r) for a, r in zip(argvs, json.loads(p.stdout.splitlines()[-1]))}


def test_module_alone_prints_the_backend_report(module):
    code, out, err = module[()]
    assert code == 0, err
    assert "backend" in out and "cpp" in out and "usage" not in out


@pytest.mark.parametrize("command", HELP)
def test_module_subcommand_help_is_the_commands_help(module, command):
    code, out, err = module[command, "--help"]
    assert code == 0, err
    assert out.startswith(f"usage: specops {command}")


def test_module_reports_a_bad_command_like_the_script(module):
    code, _, err = module["warp-drive",]
    assert code == 2
    assert "invalid choice: 'warp-drive'" in err


# ---- bad flags fail before any model loads (issue #34) -----------------------------------------

@pytest.mark.parametrize("command, flags, shows", [
    ("generate", ["--threads", "-1"], "--threads must be >= 1, got -1"),
    ("generate", ["--threads", "0"], "--threads must be >= 1, got 0"),
    ("generate", ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    ("generate", ["--top-k", "-2"], "--top-k must be >= 0, got -2"),
    ("generate", ["--json", "{tmp}/missing/dir/out.json"], "--json '{tmp}/missing/dir/out.json' cannot be written"),
    ("generate", ["--json", "{tmp}"], "--json '{tmp}' cannot be written"),
    ("demo", ["--json", "{tmp}/missing/out.json"], "--json '{tmp}/missing/out.json' cannot be written"),
    ("demo", ["--threads", "-1"], "--threads must be >= 1, got -1"),
])
def test_bad_flags_fail_cleanly_before_the_model_loads(command, flags, shows, tmp_path, capsys, monkeypatch):
    # In this process (the module entry is main(), above): a model load would fail the test.
    for name in ("load", "load_any"):
        monkeypatch.setattr(models, name, lambda *a, **k: pytest.fail("a model loaded before the flags were checked"))
    prompt = ["--prompt", "hi"] if command == "generate" else []
    try:
        code = cli.main([command, *prompt, *(f.format(tmp=tmp_path) for f in flags)])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert shows.format(tmp=tmp_path) in err and "loading" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_writable_json_path_is_not_left_behind_by_the_check(tmp_path):
    path = tmp_path / "out.json"
    cli.check_writable("--json", str(path))
    assert not path.exists()
    path.write_text("keep")
    cli.check_writable("--json", str(path))
    assert path.read_text() == "keep"
