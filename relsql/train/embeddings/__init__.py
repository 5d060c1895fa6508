"""Database-stored embeddings: one learnable row per key in a table, cached in memory-mapped
arrays, swapped on engines without transactions, sharded over training ranks and written back."""
