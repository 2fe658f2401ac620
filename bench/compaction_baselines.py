"""Single-node compaction plans over the same sealed-ledger Parquet files the Spark job reads:
the baselines bench/compaction_bench.py measures the compaction worker against.

Each plan computes PIP-14 compaction (latest message per key, tombstones delete, keyless kept)
and writes the survivors, sorted by id, to one Parquet file; it returns (seconds, rows).
- `duckdb_semijoin`: phase one reads key/ids/tombstone only (latest position per key as one
  BIGINT, tombstoned keys dropped), phase two semi-joins all columns on that set;
- `polars_semijoin`: the same plan with Polars' lazy engine;
- `duckdb_qualify`: the naive plan, `QUALIFY row_number() OVER (PARTITION BY key ...)`.
"""
from __future__ import annotations

import os
import time


def _pos_sql() -> str:
    return "(ledger_id * 4294967296 + entry_id)"


def duckdb_semijoin(files: list[str], out: str, retain_null_key: bool = True
                    ) -> tuple[float, int]:
    import duckdb
    t0 = time.perf_counter()
    con = duckdb.connect()
    src = f"read_parquet({files!r})"
    pos = _pos_sql()
    con.execute(f"""CREATE TEMP TABLE keep AS
        SELECT max({pos}) AS pos FROM {src} WHERE key IS NOT NULL GROUP BY key
        HAVING NOT arg_max(is_tombstone, {pos})""")
    keyless = "OR key IS NULL" if retain_null_key else ""
    con.execute(f"""COPY (SELECT * FROM {src}
        WHERE {pos} IN (SELECT pos FROM keep) {keyless}
        ORDER BY ledger_id, entry_id) TO '{out}' (FORMAT parquet, COMPRESSION zstd)""")
    rows = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]
    con.close()
    return time.perf_counter() - t0, rows


def duckdb_qualify(files: list[str], out: str, retain_null_key: bool = True
                   ) -> tuple[float, int]:
    import duckdb
    t0 = time.perf_counter()
    con = duckdb.connect()
    src = f"read_parquet({files!r})"
    keyless = f"UNION ALL SELECT * FROM {src} WHERE key IS NULL" if retain_null_key else ""
    con.execute(f"""COPY (SELECT * FROM (
          SELECT * FROM {src} WHERE key IS NOT NULL
          QUALIFY row_number() OVER (PARTITION BY key ORDER BY ledger_id DESC,
                                     entry_id DESC) = 1
        ) WHERE NOT is_tombstone {keyless}
        ORDER BY ledger_id, entry_id) TO '{out}' (FORMAT parquet, COMPRESSION zstd)""")
    rows = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]
    con.close()
    return time.perf_counter() - t0, rows


def polars_semijoin(files: list[str], out: str, retain_null_key: bool = True
                    ) -> tuple[float, int]:
    import polars as pl
    t0 = time.perf_counter()
    pos = (pl.col("ledger_id") * 4294967296 + pl.col("entry_id")).alias("pos")
    keys = (pl.scan_parquet(files).select("key", "is_tombstone", pos)
            .filter(pl.col("key").is_not_null())
            .group_by("key").agg(pl.col("pos").max(),
                                 pl.col("is_tombstone").sort_by("pos").last().alias("dead"))
            .filter(~pl.col("dead")).select("pos").collect())
    keep = pl.col("pos").is_in(keys["pos"].implode())
    if retain_null_key:
        keep = keep | pl.col("key").is_null()
    (pl.scan_parquet(files).with_columns(pos).filter(keep).drop("pos")
     .sort("ledger_id", "entry_id").sink_parquet(out, compression="zstd"))
    rows = pl.scan_parquet(out).select(pl.len()).collect().item()
    return time.perf_counter() - t0, rows


PLANS = {"duckdb-semijoin": duckdb_semijoin, "polars-semijoin": polars_semijoin,
         "duckdb-qualify": duckdb_qualify}


def run(plan: str, files: list[str], out_dir: str, retain_null_key: bool = True
        ) -> tuple[float, int]:
    out = os.path.join(out_dir, f"{plan}.parquet")
    if os.path.exists(out):
        os.remove(out)
    return PLANS[plan](files, out, retain_null_key)
