"""relsql.train.loop.tracking: TensorBoard and MLflow trackers as fit callbacks; the event files (read back
with tensorboard's EventAccumulator) and the MLflow file store hold every epoch record of
model.history, every step's loss, the report and the template."""

from __future__ import annotations

import importlib

import pytest

from relsql.train.loop.tracking import MLflow, TensorBoard
from tests.test_trainer import customers, model

EPOCHS = 4


def history_values(m, name: str) -> list[float]:
    return [float(r[name]) for r in m.history]


def test_tensorboard_event_files_hold_the_history_steps_report_and_template(tmp_path):
    importlib.import_module("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = model(customers(120), batch_size=25)
    steps = []
    with TensorBoard(m, tmp_path / "run") as board:
        m.fit(epochs=EPOCHS, batch_size=25, hybrid=False, time_budget=None,
              callback=lambda info: (steps.append(info["loss"]), board(info)))
    events = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert len(m.history) == EPOCHS
    for name in ("train_loss", "val_loss", "val_roc_auc", "lr"):
        logged = events.Scalars(f"epoch/{name}")
        assert [e.step for e in logged] == list(range(EPOCHS))
        assert [e.value for e in logged] == pytest.approx(history_values(m, name), rel=1e-6)
    assert [e.value for e in events.Scalars("step/loss")] == pytest.approx(steps, rel=1e-6)
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    assert any("template" in tag for tag in texts) and any(m.template.source.strip() in t for t in texts.values())
    assert any(m.report().splitlines()[0] in t for t in texts.values())
    assert (tmp_path / "run" / "template.sql").read_text() == m.template.source


def test_mlflow_file_store_holds_the_history_report_and_template(tmp_path, monkeypatch):
    mlflow = importlib.import_module("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this switch
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        m = model(customers(120))
        with MLflow(m, experiment="relsql-test") as run:
            m.fit(epochs=EPOCHS, hybrid=False, time_budget=None, callback=run)
        assert mlflow.active_run() is None  # the run it started is ended
        client = mlflow.tracking.MlflowClient()
        for name in ("train_loss", "val_loss", "val_accuracy"):
            logged = sorted(client.get_metric_history(run.run_id, name), key=lambda x: x.step)
            assert [x.step for x in logged] == list(range(EPOCHS))
            assert [x.value for x in logged] == pytest.approx(history_values(m, name), rel=1e-9)
        assert len(client.get_metric_history(run.run_id, "step_loss")) == EPOCHS  # full batch: one step per epoch
        params = client.get_run(run.run_id).data.params
        assert params["target"] == "customer.churned"
        assert (params["fit.epochs"], params["fit.hybrid"], params["fit.time_budget"]) == (str(EPOCHS), "False", "none")
        assert params["fit.callbacks"] == "MLflow" and float(params["fit.lr"]) > 0
        logged = client.get_run(run.run_id).data.metrics
        held_out = m.evaluate("test")
        assert held_out and {f"test_{k}": v for k, v in held_out.items()} == pytest.approx(
            {k: v for k, v in logged.items() if k.startswith("test_")}, rel=1e-9)
        artifacts = tmp_path / "artifacts"
        template = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path="template.sql", dst_path=str(artifacts))
        assert open(template).read() == m.template.source
        report = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path="report.txt", dst_path=str(artifacts))
        assert open(report).read() == m.report()
    finally:
        mlflow.set_tracking_uri(None)


def test_mlflows_default_store_without_its_sql_backend_names_the_fix(tmp_path, monkeypatch):
    mlflow = importlib.import_module("mlflow")
    from relsql import RelsqlError

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(None)  # mlflow's default: a SQLite file, which mlflow-skinny cannot open
    m = model(customers(60))
    with pytest.raises(RelsqlError, match=r"pip install mlflow\); or log to a folder"):
        MLflow(m, experiment="relsql-default")
    assert mlflow.active_run() is None


def test_a_tracker_follows_a_model():
    from relsql import RelsqlError

    with pytest.raises(RelsqlError, match="follows a relsql.Model"):
        TensorBoard(object(), "nowhere")
