"""Reads a commscope Parquet job trace with polars, pandas (pyarrow) and DuckDB and prints what
each engine sees, as JSON, so the Rust test can compare the engines with each other and with the
trace it wrote.

Usage: python3 check_parquet.py FILE.parquet
"""
import json
import sys

import duckdb
import pandas as pd
import polars as pl

path = sys.argv[1]

pdf = pl.read_parquet(path)
polars_view = {
    "rows": pdf.height,
    "kinds": {k: int(n) for k, n in pdf.group_by("kind").len().iter_rows()},
    "allreduce_calls": int(pdf.filter((pl.col("kind") == "call") & (pl.col("op") == "allreduce")).height),
    "allreduce_bytes": int(pdf.filter((pl.col("kind") == "call") & (pl.col("op") == "allreduce"))["bytes"].sum()),
    "ranks": sorted(int(r) for r in pdf["rank"].unique()),
    "comm_id_dtype": str(pdf.schema["comm_id"]),
}

# 64-bit ids: keep nullable integer columns integral (numpy float64 would round them).
df = pd.read_parquet(path, dtype_backend="numpy_nullable")
calls = df[(df["kind"] == "call") & (df["op"] == "allreduce")]
pandas_view = {
    "rows": int(len(df)),
    "kinds": {str(k): int(n) for k, n in df["kind"].value_counts().items()},
    "allreduce_calls": int(len(calls)),
    "allreduce_bytes": int(calls["bytes"].sum()),
    "ranks": sorted(int(r) for r in df["rank"].unique()),
    # comm ids are full 64-bit values: the hex column must match the integer column.
    "comm_hex_ok": bool((df.dropna(subset=["comm_id"]).apply(lambda r: r["comm"] == hex(int(r["comm_id"])), axis=1)).all()),
}

con = duckdb.connect()
rows = con.execute(f"select count(*) from read_parquet('{path}')").fetchone()[0]
kinds = dict(con.execute(f"select kind, count(*) from read_parquet('{path}') group by kind").fetchall())
ar = con.execute(
    f"select count(*), sum(bytes) from read_parquet('{path}') where kind = 'call' and op = 'allreduce'"
).fetchone()
# Per instance: every rank recorded the same (comm, seq) once.
bad = con.execute(
    f"""select count(*) from (
          select comm_id, seq, count(*) n, count(distinct rank) r
          from read_parquet('{path}') where kind = 'call' and op = 'allreduce'
          group by comm_id, seq having n <> r)"""
).fetchone()[0]
duck_view = {
    "rows": int(rows),
    "kinds": {str(k): int(n) for k, n in kinds.items()},
    "allreduce_calls": int(ar[0]),
    "allreduce_bytes": int(ar[1] or 0),
    "duplicate_instances": int(bad),
}

print(json.dumps({"polars": polars_view, "pandas": pandas_view, "duckdb": duck_view}))
