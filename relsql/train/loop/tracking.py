"""Runs logged to TensorBoard or MLflow, through fit's `callback=`.

A tracker is the callback (a relsql.train.loop.callbacks.Callback the trainer runs after its own):
each step's loss as it comes, and each finished epoch's record of model.history (train and
validation loss, the task's validation metrics, the learning rate) as the epoch ends; leaving the
`with` block (or `finish()`) logs any epochs not logged yet, the report and the template text::

    with relsql.TensorBoard(model, "runs/churn") as board:
        model.fit(callback=board)

    with relsql.MLflow(model, experiment="churn") as run:    # an active MLflow run, else a new one
        model.fit(callback=run)

Records are numbered by their place in model.history, so every point lands once, however often
fit is called within the block. The refit on every labelled row (relsql/train/loop/refit.py) runs
without the user's callbacks: they watch the selection run, whose epochs the history holds.

What can go wrong outside relsql is said as a RelsqlError naming the argument or the server: a
log folder that is a file, a FIFO or not a path; a `template.sql` there that relsql did not write
(never replaced, relsql/ownfiles.py); an MLflow store that fails. An MLflow server over HTTP is
asked once, with a short timeout, before anything is logged, and each of relsql's requests is
bounded (MLFLOW_HTTP_REQUEST_TIMEOUT and _MAX_RETRIES, unless set by the user): a host that does
not answer fails in seconds instead of hanging training for minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from relsql import ownfiles
from relsql.errors import RelsqlError
from relsql.train.loop.callbacks import Callback

TEMPLATE_FILE = "template.sql"
REPORT_FILE = "report.txt"


class Tracker(Callback):
    """What both trackers share: which history records and steps are logged already."""

    def __init__(self, model):
        if not hasattr(model, "learner"):
            raise RelsqlError(f"a tracker follows a relsql.Model, got {type(model).__name__}")
        self.model = model
        self.logged = len(model.history)  # records from before the tracker are not this run's
        self.steps = 0
        self.finished = False

    def __call__(self, info: dict) -> None:
        """One step done (`info`: fit's step, {"epoch", "batch", "batches", "loss"}): its loss, and
        the epochs finished since the last call."""
        self.log_step(self.steps, float(info["loss"]))
        self.steps += 1
        self.flush_history()

    def on_batch_end(self, trainer, step: dict) -> None:
        self(step)

    def on_epoch_end(self, trainer, epoch: int, record: dict) -> None:
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
        folder = log_folder(logdir)
        ownfiles.check(folder / TEMPLATE_FILE, "template", TEMPLATE_FIX)  # before training, not after
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RelsqlError("TensorBoard tracking needs tensorboard: pip install tensorboard") from None
            try:
                writer = SummaryWriter(log_dir=str(folder))
            except (OSError, ValueError, TypeError) as err:
                raise RelsqlError(f"TensorBoard cannot write its log folder {folder} (logdir): {err}; pass another "
                                  "folder") from None
        self.writer, self.logdir = writer, folder

    def log_step(self, step: int, loss: float) -> None:
        self.writer.add_scalar("step/loss", loss, step)

    def log_epoch(self, index: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"epoch/{name}", value, index)

    def log_text(self, name: str, text: str) -> None:
        self.writer.add_text(Path(name).stem, f"```\n{text}\n```")
        if name == TEMPLATE_FILE:
            ownfiles.write_text(self.logdir / name, text, "template", TEMPLATE_FIX)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MLflow(Tracker):
    """Metrics per epoch record (`<name>`, step = its index) and `step_loss` per step; the model's
    target, output and seed and every option of the first fit (`fit.<name>`) as parameters; the
    test split's metrics at finish (`test_<name>`); the report and the template as artifacts. Uses
    the active run, else starts one (in `experiment`) and ends it at finish."""

    def __init__(self, model, experiment: str | None = None, run_name: str | None = None):
        super().__init__(model)
        try:
            import mlflow
        except ImportError:
            raise RelsqlError("MLflow tracking needs mlflow: pip install mlflow-skinny") from None
        self.mlflow = mlflow
        self.uri = _shown(mlflow.get_tracking_uri())
        _reachable(mlflow.get_tracking_uri())
        self.started = mlflow.active_run() is None
        try:
            with self.calling("start a run"):
                if self.started:
                    if experiment is not None:
                        mlflow.set_experiment(experiment)
                    mlflow.start_run(run_name=run_name)
                self.run_id = mlflow.active_run().info.run_id
                mlflow.log_params({"target": model.target, "output": model.output, "seed": model.seed})
            self.fit_logged = False
        except RelsqlError:
            if self.started:
                with contextlib.suppress(Exception):
                    mlflow.end_run(status="FAILED")
            raise

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """One of relsql's MLflow calls: each HTTP request bounded in time (unless the user set the
        bounds), and any failure of the store or server a RelsqlError naming it."""
        with _bounded_requests():
            try:
                yield
            except RelsqlError:
                raise
            except Exception as err:
                message = " ".join(str(err).split())[:300] or "(no message)"
                hint = ("mlflow's default store is a SQLite file, which needs the full mlflow package (pip install "
                        "mlflow); or log to a folder: mlflow.set_tracking_uri('file:./mlruns') with "
                        "MLFLOW_ALLOW_FILE_STORE=true" if self.uri.lower().startswith("sqlite") else
                        "check the URI (mlflow.set_tracking_uri or MLFLOW_TRACKING_URI) and that its store "
                        "or server is there and writable")
                raise RelsqlError(f"MLflow could not {what} at tracking URI {self.uri}: {type(err).__name__}: {message}; "
                                  f"{hint}") from err

    def on_fit_start(self, trainer) -> None:
        """The first fit's options as parameters (`fit.epochs`, `fit.lr`, ...: MLflow keeps a run's
        parameters fixed, so a later fit in the same run, a refit say, adds none)."""
        if self.fit_logged:
            return
        self.fit_logged = True
        config = trainer.config
        options = {f"fit.{f.name}": _param(getattr(config, f.name)) for f in dataclasses.fields(config)
                   if f.name not in ("callback", "callbacks")}
        options["fit.callbacks"] = ", ".join(type(c).__name__ for c in config.users) or "none"
        with self.calling("log the fit's options"):
            self.mlflow.log_params(options)

    def __exit__(self, *exc: object) -> None:
        self.failed = exc[0] is not None  # leaving on an error: the metrics of a broken fit are not asked for
        self.finish()

    def finish(self) -> None:
        if not self.finished and self.model.history and not getattr(self, "failed", False):
            metrics = self.test_metrics()
            if metrics:
                with self.calling("log the test metrics"):
                    self.mlflow.log_metrics(metrics)
        super().finish()

    def test_metrics(self) -> dict[str, float]:
        """The held-out test split's metrics (`test_<name>`), none where the model has no test rows."""
        rows = self.model.rows
        if "test" not in rows or not len(rows["test"]):
            return {}
        values = self.model.evaluate("test")
        return {f"test_{k}": float(v) for k, v in values.items()
                if isinstance(v, (int, float)) and math.isfinite(float(v))}

    def log_step(self, step: int, loss: float) -> None:
        if math.isfinite(loss):
            with self.calling("log a step's loss"):
                self.mlflow.log_metric("step_loss", loss, step=step)

    def log_epoch(self, index: int, values: dict[str, float]) -> None:
        finite = {k: v for k, v in values.items() if math.isfinite(v)}  # an undefined metric (one class) is left out
        if finite:
            with self.calling("log an epoch's metrics"):
                self.mlflow.log_metrics(finite, step=index)

    def log_text(self, name: str, text: str) -> None:
        with self.calling(f"log {name}"):
            self.mlflow.log_text(text, name)

    def close(self) -> None:
        if self.started:
            with self.calling("end the run"):
                self.mlflow.end_run()


def _param(value: object) -> str:
    """An option as MLflow shows it: None as "none", paths and tuples as text (MLflow keeps 6,000 characters)."""
    return "none" if value is None else str(value)[:6000]


TEMPLATE_FIX = "pass another log folder, or move that file away"
REQUEST_SECONDS = 10  # each MLflow HTTP request relsql makes, unless MLFLOW_HTTP_REQUEST_TIMEOUT says otherwise
REQUEST_RETRIES = 2  # and its retries (MLflow's default, 7 with backoff, waits minutes for a dead host)
PROBE_SECONDS = 5  # the first contact with a tracking server, unless MLFLOW_HTTP_REQUEST_TIMEOUT says otherwise


def log_folder(logdir: object) -> Path:
    """TensorBoard's `logdir` as a folder relsql may write to (created if missing): a non-empty
    path that is not a file, a FIFO or a device. A RelsqlError naming `logdir` otherwise."""
    if isinstance(logdir, bytes) or not isinstance(logdir, str | os.PathLike):
        raise RelsqlError(f"TensorBoard's logdir must be a folder path (a str or Path), got {type(logdir).__name__} "
                          f"{logdir!r:.80}")
    text = os.fspath(logdir)
    if not isinstance(text, str) or not text.strip() or "\0" in text:
        raise RelsqlError(f"TensorBoard's logdir must name a folder, got {text!r:.80}: pass e.g. 'runs/churn'")
    folder = Path(text)
    if os.path.lexists(folder) and not folder.is_dir():
        raise RelsqlError(f"TensorBoard's logdir {folder} exists and is not a folder (a file, FIFO, device or broken "
                          "link): pass a folder, or a path where one can be created")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RelsqlError(f"cannot create TensorBoard's logdir {folder}: {err.strerror or err}; pass another "
                          "folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise RelsqlError(f"TensorBoard's logdir {folder} is not writable; pass a folder you can write")
    return folder


@contextlib.contextmanager
def _bounded_requests() -> Iterator[None]:
    """MLflow's HTTP timeout and retries bounded for the calls within (those the user set are kept)."""
    bounds = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_SECONDS), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(REQUEST_RETRIES)}
    added = [name for name in bounds if name not in os.environ]
    for name in added:
        os.environ[name] = bounds[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _shown(uri: str) -> str:
    """The tracking URI as an error may show it: without a password in it."""
    parts = urllib.parse.urlsplit(str(uri))
    if parts.password is None and parts.username is None:
        return str(uri)
    host = parts.hostname or ""
    return urllib.parse.urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


def _reachable(uri: str) -> None:
    """An HTTP(S) tracking server answers (any HTTP status will do) within a few seconds; else a
    RelsqlError saying so, before training starts. Other URIs (a file store, databricks) are not asked."""
    if urllib.parse.urlsplit(str(uri)).scheme.lower() not in ("http", "https"):
        return
    try:
        seconds = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or PROBE_SECONDS)
    except ValueError:
        seconds = PROBE_SECONDS
    try:
        # without credentials: any answer, 401 included, tells the server is there
        with urllib.request.urlopen(urllib.request.Request(_shown(uri), method="GET"), timeout=seconds):
            return
    except urllib.error.HTTPError:  # it answered: reachable, whatever it thinks of the request
        return
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise RelsqlError(f"the MLflow tracking server {_shown(uri)} did not answer within {seconds:g} s ({reason}); "
                          "start it or fix the URI (mlflow.set_tracking_uri or MLFLOW_TRACKING_URI), or set "
                          "MLFLOW_HTTP_REQUEST_TIMEOUT to wait longer") from None
