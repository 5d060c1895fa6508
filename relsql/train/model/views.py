"""What a `relsql.Model` shows of its learner, declared: the target, the parts of the trained net
and the record of training, each a read-only attribute with its own line in `help(relsql.Model)`
and in an IDE's completion. The learner (relsql/train/learner/learner.py) holds them; `model.learner` is
the way to anything else."""

from __future__ import annotations


def _read(name: str, doc: str) -> property:
    """A read-only attribute that is the learner's `name`."""
    return property(lambda self: getattr(self.learner, name), doc=doc)


def _recorded(name: str, doc: str) -> property:
    """A read-only attribute that is one field of the learner's record of training (relsql/train/learner/record.py)."""
    return property(lambda self: getattr(self.learner.record, name), doc=doc)


def _setting(name: str, doc: str) -> property:
    """A read-only attribute that is one of the learner's settings."""
    return property(lambda self: getattr(self.learner.settings, name), doc=doc)


class LearnerViews:
    """The Model's read-only attributes, read from its learner."""

    # -- the target
    target = _read("target", '"table.column" the model predicts')
    table = _read("table", "the target's table")
    column = _read("column", "the target's column")
    output = _read("output", "the template's relation trained to predict the target")
    task = _read("task", "the task: kind (binary, multiclass, regression, ranking), classes, metric, loss")
    answers = _read("answers", 'the method giving the model\'s answers: "predict" (one value per row) or "recommend" '
                    "(a ranking target's k best candidates per row)")
    time_column = _read("time_column", "the target table's time column, if any (rows are cut at each row's time)")
    fractions = _read("fractions", "the (train, val, test) shares of the labelled rows")
    seed = _read("seed", "the seed of the split and of the initial weights")
    rows = _read("rows", 'the split: {"train", "val", "test"} -> positions among the labelled rows')
    labelled = _read("labelled", "the output rows with a label (positions among all output rows)")
    positions = _read("positions", "the target rows' positions among the output rows")
    y = _read("y", "the labels of the labelled rows (encoded as the task trains on them)")
    # -- the net and how it runs
    template = _read("template", "the template (relsql.Template) the net was compiled from")
    net = _read("net", "the compiled net (relsql.compile's CompiledNet)")
    head = _read("head", "the task's head on top of the output relation")
    batched = _read("batched", "the mini-batch machinery (grounding store or on-demand grounding), if any")
    mini_batches = _read("mini_batches", "whether batches come from the grounding store or on-demand grounding")
    output_rows = _read("output_rows", "the number of rows of the output relation")
    settings = _read("settings", "how the model grounds, runs and stores its batches")
    dtype = _setting("dtype", "the floating-point type of weights and features")
    device = _setting("device", "where the net runs")
    # -- the record of training
    history = _recorded("history", "one record per epoch: train and validation loss and metrics, learning rate")
    best_epoch = _recorded("best_epoch", "the epoch whose weights were kept, 0-based as history[i]['epoch'] (the report "
                                         "and the log say epoch best_epoch + 1: the epochs trained), None before fit")
    stopped = _recorded("stopped", 'why training stopped: "epochs", "patience", "time budget (...)", "diverged (...)"')
    monitor = _recorded("monitor", 'the history entry that chose the best epoch, e.g. "val_roc_auc"')
    epoch_cap = _recorded("epoch_cap", "the epochs fit was given")
    time_budget = _recorded("time_budget", "fit's time budget in seconds, None if none")
    refit = _read("refit", "after a refit on every labelled row: its epochs, rows, and the held-out scores measured before it")
    no_refit = _read("no_refit", "after a fit that did not refit: why (refit=False, or what prevented it)")
    hybrid = _read("hybrid", "the GBM blended with the net and its weight, where fit picked one")
    trials = _read("trials", "after search(): one row per trial")
    timings = _recorded("timings", "seconds per phase: grounding, planning, training, ...")

    def parameters(self):
        """The trainable weights (the net's and the head's), as torch's Module.parameters()."""
        return self.learner.parameters()
