"""What a user's install must get right: extensions built against another torch fail at import with
a message that says so and how to rebuild (not an undefined-symbol error, not silent luck)."""
import subprocess
import sys

import torch


def test_extensions_built_against_another_torch_fail_clearly_at_import():
    code = ("import sys, types; m = types.ModuleType('specops._build_info'); m.TORCH_VERSION = '2.0.0+other'; "
            "sys.modules['specops._build_info'] = m; import specops")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert (f"built against torch 2.0.0+other, but torch {torch.__version__} is installed" in proc.stderr
            and "--no-build-isolation" in proc.stderr), proc.stderr[-2000:]


def test_the_installed_build_records_this_torch():
    from specops import _build_info

    assert _build_info.TORCH_VERSION == torch.__version__
