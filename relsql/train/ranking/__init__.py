"""Ranking targets: a foreign-key (or list-of-keys) target column ranks the rows it can reference.

Two towers from the template (the output relation per target row, a candidate relation per
referenced row), scored by their dot product; exact chunked top-k; sampled negatives; MAP@k and
friends. See docs/recommendation.md.
"""
