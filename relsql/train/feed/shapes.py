"""Batch shapes with headroom, so a training loop stops recording new plans after its first epochs.

The plan cache (relsql/compile/reuse.py) pads a batch to its bucketed sizes and records one plan
per padded shape. Shuffled batches of one size differ in their closures' sizes (a customer's
orders, the products they name), so each epoch brought batches a little past every recorded
shape: on the 25k-row shop at batch 512, one new shape per epoch for the first 15 epochs, each a
recording (~50 ms) and a check against a fresh plan (as much again) where a replay costs ~6 ms.
Here a shape recorded for a batch that fits no recorded one is the elementwise peak of the
batches of its kind seen so far (same relations, rules and columns; within the cache's SLACK of
this batch's volume), grown by HEADROOM: later batches of that kind fit it (5 shapes in 30
epochs there instead of 15, for 2% more padding on average).
"""

from __future__ import annotations

import math

from relsql.compile.reuse import PlanCache, bucket, fits, shape_for, volume

HEADROOM = 1 / 16  # a new shape's sizes: the peak seen, this much larger, then bucketed


def _kind(need: tuple) -> tuple:
    """A need less its sizes: batches of one kind can share a padded shape."""
    relations, vocab = need
    return tuple((name, tuple(rule[2:] for rule in rules)) for name, _, rules in relations), vocab


def _peak(a: tuple, b: tuple) -> tuple:
    """The elementwise larger sizes of two needs of one kind."""
    relations = []
    for (name, n, rules), (_, m, rules_b) in zip(a[0], b[0]):
        relations.append((name, max(n, m), tuple((max(r[0], q[0]), max(r[1], q[1]), *r[2:]) for r, q in zip(rules, rules_b))))
    return tuple(relations), a[1]


def _grown(need: tuple, headroom: float) -> tuple:
    """`need` with every size `headroom` larger, kept consistent (a rule whose heads are every row
    keeps them so, uniform groundings per head stay uniform, an ungrouped rule one grounding a
    head), and relations of as many rows padded to as many: a gather between two of them stays
    the identity the passes remove (else the plan pulls gathers through scatters, and the count
    of rows it keeps, which differs per batch, makes every batch a new plan variant)."""
    relations, sized = need[0], []
    for _, n, rules in relations:
        size = math.ceil(n * (1 + headroom))
        heads = [size if r[2] else min(math.ceil(r[0] * (1 + headroom)), size) for r in rules]
        extra = max([bucket(h + 1) - h for h, r in zip(heads, rules) if not r[2]] + [1]) if rules else 0
        sized.append((bucket(size + extra), extra, heads))
    target: dict[int, int] = {}
    for (_, n, _), (padded, _, _) in zip(relations, sized):
        target[n] = max(target.get(n, 0), padded)
    grown = []
    for (name, n, rules), (_, extra, heads) in zip(relations, sized):
        size = target[n] - extra  # shape_for pads it back to target[n]
        out = []
        for more, (old, rows, full, per_head, grouped, columns) in zip(heads, rules):
            more = size if full else more
            if per_head is not None:
                rows_more = more * per_head
            elif not grouped:
                rows_more = rows + more - old
            else:
                rows_more = max(math.ceil(rows * (1 + headroom)), rows + more - old)  # a grounding per pad head
            out.append((more, rows_more, full, per_head, grouped, columns))
        grown.append((name, size, tuple(out)))
    return tuple(grown), need[1]


class BatchPlans(PlanCache):
    """The plan cache of a model's mini-batches: a batch that fits no recorded shape gets one
    sized for the batches of its kind seen so far, with headroom (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peaks: list[tuple] = []  # per group of batches sharing shapes: the peak of their needs

    def _shape(self, need: tuple) -> tuple:
        """A recorded shape `need` fits (the cache's choice), else a grown one for its kind (never a refused one)."""
        chosen = super()._shape(need)
        if chosen in self.traces:
            return chosen
        own = shape_for(need)
        limit, kind = volume(own) * self.SLACK, _kind(need)
        candidates = []
        for i, seen in enumerate(self.peaks):
            if _kind(seen) == kind:
                peak = _peak(seen, need)
                shape = shape_for(_grown(peak, HEADROOM))
                if volume(shape) <= limit and shape not in self.refused and fits(need, shape):
                    candidates.append((volume(shape), i, peak, shape))
        if candidates:
            _, i, peak, shape = min(candidates, key=lambda c: c[0])
            self.peaks[i] = peak
            return shape
        shape = shape_for(_grown(need, HEADROOM))
        if volume(shape) > limit or shape in self.refused or not fits(need, shape):
            return own
        if len(self.peaks) < self.MAX_SHAPES:
            self.peaks.append(need)
        return shape
