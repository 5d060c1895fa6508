"""Datasets to run relsql on, apart from the source connectors (relsql.connectors): loaders that
create tables in a DuckDB connection, used by the demo, the tests, bench/ and demos/.

- ``relsql.datasets.mutagenesis``: the demo's data, shipped as package data (no checkout, no download);
- ``relsql.datasets.neuralogic_files``: NeuraLogic example/query files and PyNeuraLogic's built-in datasets;
- ``relsql.datasets.tu_format``: TU graph datasets (MUTAG from the grakel wheel);
- ``relsql.datasets.tpch``: TPC-H generated inside DuckDB (the extra ``relsql[sources]``).

The loaders sit above the connectors (tpch reads the extension loader and PostgreSQL's URL rules);
no connector imports a loader.
"""
