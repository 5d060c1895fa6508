"""Synthetic relational data with a signal planted at a known distance from the target.

    import duckdb
    from demos.synthetic import shop
    con = duckdb.connect()
    shop.build(con, customers=2000, products=200, seed=0)   # {'customer': 2000, 'product': 200, 'orders': ...}

See ``README.md`` in this folder for what is planted and why.
"""

from demos.synthetic.shop import build

__all__ = ["build"]
