"""Ranks started by Spark's TorchDistributor when the model's engine is Spark (placeholder)."""

from __future__ import annotations


def applies(db) -> bool:
    return False


def run(db, job) -> dict:
    raise NotImplementedError
