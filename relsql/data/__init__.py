"""relsql's data layer: the engines a database runs on (DuckDB, Spark) and their interface."""
