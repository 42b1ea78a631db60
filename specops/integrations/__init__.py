"""Integrations of specops ops with model libraries."""
