"""Storage: SQLAlchemy Core tables, queries, transactions and migrations.

One module per API resource; each takes a ``Connection`` inside a
transaction opened by the caller (see ``engine.Database``), so a handler's
whole write is one transaction.
"""
