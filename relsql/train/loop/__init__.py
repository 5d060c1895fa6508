"""Training: the one loop (Trainer) and its callbacks, schedule, options and refit, the trackers,
and the strategies that run it (one process, ranks, Spark's TorchDistributor) behind Model.fit."""
