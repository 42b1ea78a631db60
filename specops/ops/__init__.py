"""Public ops, one folder per family stem (the same stem in csrc/, triton_kernels/, tests/, bench/):
``<stem>/__init__.py`` the entry, its contract, checks and backend registrations, ``ref.py`` the
torch reference, ``plan.py`` where the op has a plan. ``checks.py`` (the rule vocabulary) and
``layout.py`` (``KvLayout``) are shared by every op."""
