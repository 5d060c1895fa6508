"""fit(hybrid=False) of an automatic template keeps the whole template or its own-columns part, whichever
the validation rows prefer (relsql/train/model/own_columns.py): checked against the two models trained apart
and picked by hand, on hostile databases where each side wins once (seed 10: the whole template, seed 5: the
own columns)."""

from __future__ import annotations

import pytest

import relsql
from relsql.train.model import own_columns
from tests.test_auto_leaves import hostile_copy


def _model(db, template, entry):
    options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
    return relsql.Model(db, template, target=entry["target"], seed=0, progress=False, **options)


@pytest.mark.parametrize(("seed", "kept"), [(10, "whole template"), (5, "own columns")])
def test_the_network_alone_keeps_the_better_validation_loss_of_the_two_fits(monkeypatch, tmp_path, hostile, seed, kept):
    manifest = hostile[seed]
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]  # item.label: a binary target, its epochs chosen on the validation loss
    options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
    template = relsql.Template.auto(db, entry["target"], **options)
    chosen = _model(db, template, entry).fit(hybrid=False)

    monkeypatch.setattr(own_columns, "CHOOSE", False)  # by hand: each model trained as written
    whole = _model(db, template, entry).fit(hybrid=False)
    alone = _model(db, relsql.Template.from_sql(own_columns.part(template)), entry).fit(hybrid=False)
    losses = [m.history[m.best_epoch]["val_loss"] for m in (whole, alone)]
    expected = alone if losses[1] < losses[0] else whole

    assert chosen.learner.own_columns == {"kept": kept, "metric": "loss", "whole": losses[0], "own": losses[1]}
    assert (expected is alone) == (kept == "own columns")
    assert chosen.template.source == expected.template.source
    assert chosen.predict().equals(expected.predict())  # the same seeded fit, bit for bit
    assert chosen.evaluate() == expected.evaluate()
    assert f"network alone: kept the {kept}" in chosen.report()
    assert getattr(whole.learner, "own_columns", None) is None


def test_the_part_is_the_target_encoder_and_the_prediction_s_own_term(tmp_path, hostile):
    manifest = hostile[0]
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    template = relsql.Template.auto(db, entry["target"], time_column=entry["time_column"])
    text = own_columns.part(template)
    part = relsql.Template.from_sql(text)
    assert set(part.relations) == {"own_item", "predict"}  # the wider encoding only the prediction's own term reads
    assert part.relations["own_item"].rules[0].expr == template.relations["own_item"].rules[0].expr
    assert set(part.weights) < set(template.weights) and "w_out_own" in part.weights and "w_out" not in part.weights
    assert all(part.weights[n].shape == template.weights[n].shape for n in part.weights)
    assert "from up to 0 foreign-key hops away" in text.splitlines()[0]
    # where the prediction has no own term, or the text is not Template.auto's, there is nothing to compare
    assert own_columns.part(relsql.Template.auto(db, entry["target"], time_column=entry["time_column"], hops=0)) is None
    edited = template.source.replace(" + linear(e.h, 1, 'w_out_own')", "")
    assert own_columns.part(relsql.Template.from_sql(edited)) is None
    assert own_columns.part(relsql.Template.from_sql(template.source.split("\n", 1)[1])) is None


def test_no_second_fit_with_the_blend_or_the_user_s_callbacks(tmp_path, hostile):
    manifest = hostile[3]
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    template = relsql.Template.auto(db, entry["target"], time_column=entry["time_column"])
    for fit in ({"epochs": 5}, {"hybrid": False, "epochs": 5, "callbacks": [relsql.Callback()]},
                {"hybrid": False, "epochs": 5, "time_budget": 600}):
        model = _model(db, template, entry).fit(**fit)
        assert getattr(model.learner, "own_columns", None) is None, fit
        assert model.template.source == template.source
    model = _model(db, template, entry).fit(hybrid=False, epochs=5)
    assert model.learner.own_columns is not None  # the same fit without them compares the two


def test_an_own_columns_part_that_cannot_train_leaves_the_whole_template(monkeypatch, tmp_path, hostile, caplog):
    manifest = hostile[3]
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    template = relsql.Template.auto(db, entry["target"], time_column=entry["time_column"])
    broken = (template.source.splitlines()[0]  # a column the table lacks: building it fails
              + "\nCREATE TABLE predict AS\nSELECT e.\"item_id\", linear(e.nope, 1, 'w') AS h\nFROM item e;\n")
    monkeypatch.setattr(own_columns, "part", lambda template, output="predict": broken)
    model = _model(db, template, entry).fit(hybrid=False, epochs=5)
    assert model.template.source == template.source and model.learner.own_columns is None
    assert "its own-columns part did not train" in caplog.text


def test_a_second_fit_compares_its_own_epochs(tmp_path, hostile):
    manifest = hostile[10]  # the whole template is kept: a second fit of it compares again
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    model = _model(db, relsql.Template.auto(db, entry["target"], time_column=entry["time_column"]), entry)
    first = model.fit(hybrid=False, epochs=30).learner.own_columns
    assert first["kept"] == "whole template"
    second = model.fit(hybrid=False, epochs=30).learner.own_columns  # the history now holds both fits' epochs
    assert second["whole"] != first["whole"]  # the second fit went on from the first's weights, better
    assert second["whole"] == model.learner.record.kept()["val_loss"] < second["own"]  # not the first fit's epoch
    assert second["kept"] == "whole template"


def test_the_cli_saves_beside_the_model_the_template_it_kept(tmp_path, hostile, capsys):
    from relsql.cli import main

    manifest = hostile[5]  # the own columns are kept (the first test)
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    whole = relsql.Template.auto(db, entry["target"], time_column=entry["time_column"])
    db.close()
    argv = ["train", tmp_path / "db.duckdb", "--target", entry["target"], "--time-column", entry["time_column"],
            "--no-hybrid", "--model", tmp_path / "m.pt", *(["--keys", manifest["keys"]] if manifest.get("keys") else [])]
    assert main([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    saved = (tmp_path / "m.sql").read_text()
    model = relsql.Model.load(tmp_path / "m.pt", relsql.connect(
        tmp_path / "db.duckdb", **({"keys": manifest["keys"]} if manifest.get("keys") else {})))
    assert saved == model.template.source == own_columns.part(whole) != whole.source
    assert f"the automatic template's own-columns part, the one the network kept, saved to {tmp_path / 'm.sql'}" in out


def test_a_model_that_kept_its_own_columns_says_so_after_a_second_fit(tmp_path, hostile):
    manifest = hostile[5]  # seed 5: the own columns are kept
    db = hostile_copy(manifest, tmp_path)
    entry = manifest["targets"][0]
    model = _model(db, relsql.Template.auto(db, entry["target"], time_column=entry["time_column"]), entry)
    assert model.fit(hybrid=False).learner.own_columns["kept"] == "own columns"
    model.fit(hybrid=False, epochs=5)  # the part alone: nothing left to compare it with
    assert model.learner.own_columns == {"kept": "own columns", "earlier": True}
    assert "network: the target table's own columns only (the part an earlier fit kept" in model.report()
    assert own_columns.is_part(model.template)
    model.fit(epochs=5)  # blended: the blend's network is still the part
    assert "network: the target table's own columns only (the part an earlier fit kept" in model.report()
    whole = _model(db, relsql.Template.auto(db, entry["target"], time_column=entry["time_column"]), entry)
    assert "an earlier fit kept" not in whole.fit(epochs=5).report()  # a whole template: no such line
    assert not own_columns.is_part(whole.template)
