"""``pytest bench/ --benchmark-only``: the bench files import ``_harness`` as a top-level module."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
