"""Training support: task types, metrics, splits, reports."""
