"""Leakage checks (relsql/train/task/leakage.py): columns that copy the label."""

from __future__ import annotations

import relsql


def test_copies_of_the_label_are_found_across_number_types_without_failing_comparisons(monkeypatch):
    """A 0/1 integer copy of a boolean label counts as a copy; a text column is never compared with
    it (the comparison would fail, and Spark logs every failed job)."""
    from relsql.train.task.leakage import copies_of

    db = relsql.connect()
    db.execute("CREATE TABLE c AS SELECT i AS id, i % 3 = 0 AS churned, (i % 3 = 0)::INTEGER AS flag01, "
               "i % 2 AS other, 'x' || i AS note FROM range(50) t(i)")
    failures = []
    arrow = db.arrow

    def counted(query):
        try:
            return arrow(query)
        except Exception as err:
            failures.append(err)
            raise

    monkeypatch.setattr(db, "arrow", counted)
    assert copies_of(db, "c", "churned") == {"flag01"}
    assert failures == []
