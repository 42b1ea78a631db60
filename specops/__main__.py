"""``python -m specops [command ...]`` is ``specops [command ...]``; alone it prints the backend report."""
import sys

from .cli import main

raise SystemExit(main(sys.argv[1:] or ["info"]))
