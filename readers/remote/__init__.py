"""Datasets behind a URL, and reading ahead of the consumer (local and remote)."""
