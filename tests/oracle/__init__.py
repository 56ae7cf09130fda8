"""The per-key upsert engine, kept as the property tests' oracle.

It was the product's first engine (Materialize's upsert operator, key by key:
``state`` holds a ``StateValue`` per key behind a ``StateBackend`` from ``backends``,
``drain`` stages source updates and drains them). The product now runs the columnar
engine (``upsert_core.columnar``); the tests compare the two, and ``tests/model.py``
with both. Nothing in the product imports this package.
"""
