"""Drafters: one per method family (see base.py for the protocol)."""
