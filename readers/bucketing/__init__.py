"""Aspect buckets and token budgets: which shape each image gets, and the bucketed order and geometry."""
