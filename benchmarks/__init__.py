"""zeroloss benchmark suite (issue 8): ``python -m benchmarks [--quick] [--runs N] [--only NAME ...]``.

Every figure is measured against PostgreSQL in a database the suite creates and drops itself,
next to the raw-SQL limit measured in the same run. See ``docs/benchmarks.md``.
"""
