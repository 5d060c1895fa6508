"""Training: the product layer under relsql.Model, in rooms whose imports point to lower rooms only
(lowest first; tests/test_imports.py checks there is no cycle):

task/        what is predicted: target, task kinds (ranking's too), split, metrics, checks, leakage
gbm/         one-hop SQL features, LightGBM trees, the baselines, the network/GBM hybrid
persist/     files (checkpoint) and the trained model's state as plain data (saved)
embeddings/  database-stored embeddings: row cache, swapped (Spark), sharded on ranks, write-back
feed/        what a step reads: batches, the batch source, the batch process, batched nets, shapes, guards
learner/     the trainable model (learner, loaded) and what it gives back (results, rows), its record,
             defaults and threads
ranking/     the ranking kind: its target, learner, losses, negatives, top-k and metrics (its task in task/)
loop/        the one Trainer and its callbacks, schedule, options, refit and trackers; the strategies
             (one process, ranks in distributed, torch_distributor) and fitting, which picks one
model/       what relsql.Model is made of: spec, build, views, calls, search, report, gradients, loader

persist/saved picks a model file's task kind from task/ (task.Task, task.ranking.RankingTask);
model/build picks the learner of a kind, above ranking/.
"""
