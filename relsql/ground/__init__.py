"""Grounding: rule bodies run as SQL joins, results become index tensors."""
