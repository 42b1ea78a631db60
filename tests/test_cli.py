"""``python -m specops`` is the ``specops`` command: same subcommands, same exit codes; alone it
prints the backend report."""
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "specops", *args], capture_output=True, text=True, timeout=120)


def test_module_alone_prints_the_backend_report():
    done = run()
    assert done.returncode == 0, done.stderr
    assert "backend" in done.stdout and "cpp" in done.stdout and "usage" not in done.stdout


@pytest.mark.parametrize("command", ["generate", "demo", "distill", "info"])
def test_module_subcommand_help_is_the_commands_help(command):
    done = run(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: specops {command}")


def test_module_reports_a_bad_command_like_the_script():
    done = run("warp-drive")
    assert done.returncode == 2
    assert "invalid choice: 'warp-drive'" in done.stderr
