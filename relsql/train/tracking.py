"""Runs logged to TensorBoard or MLflow, through fit's `callback=`.

A tracker is the callback: each step's loss as it comes, and each finished epoch's record of
model.history (train and validation loss, the task's validation metrics, the learning rate) once
the next epoch starts; leaving the `with` block (or `finish()`) logs the last epochs, the
report and the template text::

    with relsql.TensorBoard(model, "runs/churn") as board:
        model.fit(callback=board)

    with relsql.MLflow(model, experiment="churn") as run:    # an active MLflow run, else a new one
        model.fit(callback=run)

Records are numbered by their place in model.history (a refit's epochs follow the selection's),
so every point lands once, however often fit is called within the block.
"""

from __future__ import annotations

import math
from pathlib import Path

from relsql.errors import RelsqlError

TEMPLATE_FILE = "template.sql"
REPORT_FILE = "report.txt"


class Tracker:
    """What both trackers share: which history records and steps are logged already."""

    def __init__(self, model):
        if not hasattr(model, "learner"):
            raise RelsqlError(f"a tracker follows a relsql.Model, got {type(model).__name__}")
        self.model = model
        self.logged = len(model.history)  # records from before the tracker are not this run's
        self.steps = 0
        self.finished = False

    def __call__(self, info: dict) -> None:
        """fit's callback: one step done."""
        self.log_step(self.steps, float(info["loss"]))
        self.steps += 1
        self.flush_history()

    def flush_history(self) -> None:
        """The history records not logged yet, each at its index."""
        history = self.model.history
        for index in range(self.logged, len(history)):
            record = history[index]
            self.log_epoch(index, {k: float(v) for k, v in record.items() if k != "epoch" and isinstance(v, (int, float))})
        self.logged = len(history)

    def finish(self) -> None:
        """The last epochs, the report and the template; then the tracker is closed."""
        if self.finished:
            return
        self.finished = True
        try:
            self.flush_history()
            if self.model.history:
                self.log_text(REPORT_FILE, self.model.report())
            self.log_text(TEMPLATE_FILE, self.model.template.source)
        finally:
            self.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    # what each tracker does
    def log_step(self, step: int, loss: float) -> None:
        raise NotImplementedError

    def log_epoch(self, index: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def log_text(self, name: str, text: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    """Scalars `step/loss` per step and `epoch/<name>` per epoch record; the report and the
    template as text summaries, and the template also as `template.sql` in `logdir`."""

    def __init__(self, model, logdir: str | Path, writer=None):
        super().__init__(model)
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RelsqlError("TensorBoard tracking needs tensorboard: pip install tensorboard") from None
            writer = SummaryWriter(log_dir=str(logdir))
        self.writer, self.logdir = writer, Path(logdir)

    def log_step(self, step: int, loss: float) -> None:
        self.writer.add_scalar("step/loss", loss, step)

    def log_epoch(self, index: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"epoch/{name}", value, index)

    def log_text(self, name: str, text: str) -> None:
        self.writer.add_text(Path(name).stem, f"```\n{text}\n```")
        if name == TEMPLATE_FILE:
            _write_new(self.logdir / name, text)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MLflow(Tracker):
    """Metrics per epoch record (`<name>`, step = its index) and `step_loss` per step; the model's
    target, output and seed as parameters; the report and the template as artifacts. Uses the
    active run, else starts one (in `experiment`) and ends it at finish."""

    def __init__(self, model, experiment: str | None = None, run_name: str | None = None):
        super().__init__(model)
        try:
            import mlflow
        except ImportError:
            raise RelsqlError("MLflow tracking needs mlflow: pip install mlflow-skinny") from None
        self.mlflow = mlflow
        self.started = mlflow.active_run() is None
        if self.started:
            if experiment is not None:
                mlflow.set_experiment(experiment)
            mlflow.start_run(run_name=run_name)
        self.run_id = mlflow.active_run().info.run_id
        mlflow.log_params({"target": model.target, "output": model.output, "seed": model.seed})

    def log_step(self, step: int, loss: float) -> None:
        if math.isfinite(loss):
            self.mlflow.log_metric("step_loss", loss, step=step)

    def log_epoch(self, index: int, values: dict[str, float]) -> None:
        finite = {k: v for k, v in values.items() if math.isfinite(v)}  # an undefined metric (one class) is left out
        if finite:
            self.mlflow.log_metrics(finite, step=index)

    def log_text(self, name: str, text: str) -> None:
        self.mlflow.log_text(text, name)

    def close(self) -> None:
        if self.started:
            self.mlflow.end_run()


def _write_new(path: Path, text: str) -> None:
    """Write `path` atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
