"""relsql's data layer: the engines a database runs on and what relsql reads of it.

- engine.py: `Engine` (`relsql.Database`), the verbs the pipeline calls, and what is engine-independent;
- duckdb.py, spark.py: the two engines, siblings (DuckDB also runs every source the connectors attach);
- spark_ship.py: relsql itself sent to Spark's executors that lack it, their dependencies checked;
- sources.py, connection.py: `Source`, the engine-neutral base of a kind of source (DuckDB's
  `DuckDBSource` and Spark's `SparkSource` extend it), the registry of kinds of source, and
  `relsql.connect`, which walks it (the connectors themselves are relsql/connectors/);
- catalog.py, keys.py, keyfile.py, references.py: tables, columns, declared, given and inferred keys, and
  the table a target column references.

It imports only itself, the connectors and the leaves (errors, sql, textfile, arguments); grounding,
compilation, templates and training sit above it (tests/test_imports.py).
"""
