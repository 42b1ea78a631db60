"""specops benchmarks: one harness (``_harness.py``), one ``bench_<stem>.py`` per op family plus
``bench_decoding.py`` end to end. ``python -m bench`` runs them all; see ``__main__.py``."""
import os
import sys

# The bench files import their harness as a top-level module (``from _harness import ...``) so that
# ``python bench/bench_<stem>.py`` works; make that import work when they load as ``bench.*`` too.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
