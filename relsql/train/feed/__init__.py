"""What a training step reads: mini-batches of target rows, the batch source that prepares the next
one ahead (in a thread or a child process), demand-grounded batches, batch shapes, and guards."""
