"""What is predicted and how it is scored: the target column and its labelled rows, the task kind,
the splits, the metrics, and the checks made before training (keys, leakage)."""
