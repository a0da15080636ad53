#!/usr/bin/env python3
"""Helpers of scripts/bench.sh, run with the peer's Python (deltalake, duckdb, pyarrow).

  bench_tools.py check --peers DIR --tidemark TABLE --truth TABLE --work FILE.parquet
      Content check. tidemark's target keeps soft-delete tombstones (`_deleted = true`) and, with
      pipelines/payments.yml, drops the `op` column; the peer's full reload hard-deletes and keeps
      `op` ('U' on every row it keeps). So the live rows of tidemark's target (NOT _deleted) are
      written to FILE.parquet with the peer's columns (op = 'U'; a kept `op` column is used as
      is), and compared with the peer's `verify.py digest` and `verify.py diff`. Exit 1 when the
      digests differ.

  bench_tools.py watermark --table NAME=PATH ... [--reps N]
      max(updated_at) of each Delta table two ways, after opening it once: from the log's per-file
      statistics (what tidemark's lake::max_from_stats reads: delta-rs add actions, flattened) and
      by scanning the column (what the peer's job does). Median/min/max milliseconds per way.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

TYPES = {"payment_id": "VARCHAR", "customer_id": "VARCHAR", "merchant_id": "VARCHAR",
         "amount_cents": "BIGINT", "currency": "VARCHAR", "status": "VARCHAR",
         "created_at": "TIMESTAMPTZ", "updated_at": "TIMESTAMPTZ", "_ingested_at": "TIMESTAMPTZ",
         "op": "VARCHAR"}


def check(args) -> int:
    sys.path.insert(0, args.peers)
    import verify  # the peer's own digest and diff

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    t = DeltaTable(args.tidemark)
    schema = {f.name: str(f.type) for f in t.schema().fields}
    files = t.file_uris()
    src = "read_parquet([" + ",".join("'" + f.replace("'", "''") + "'" for f in files) + "], union_by_name = true)"
    sel = []
    for c in verify.COLS:
        if c == "op" and "op" not in schema:
            sel.append("'U'::VARCHAR AS op")
        else:
            sel.append(f"{c}::{TYPES.get(c, 'VARCHAR')} AS {c}")
    live = "NOT coalesce(_deleted, false)" if "_deleted" in schema else "true"
    if "op" in schema:
        live += " AND op IS DISTINCT FROM 'D'"
    total, tomb = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE NOT ({live})) FROM {src}").fetchone() if files else (0, 0)
    if files:
        con.execute(f"COPY (SELECT {', '.join(sel)} FROM {src} WHERE {live}) TO '{args.work}' (FORMAT parquet)")
    else:
        cols = ", ".join(f"NULL::{TYPES[c]} AS {c}" for c in verify.COLS)
        con.execute(f"COPY (SELECT {cols} WHERE false) TO '{args.work}' (FORMAT parquet)")
    mine = verify.digest(con, args.work)
    truth = verify.digest(con, args.truth)
    d = verify.diff(con, args.work, args.truth)
    keys = ("rows", "distinct_keys", "sum_amount_cents", "content_hash")
    same = all(mine[k] == truth[k] for k in keys)
    out = {"identical": same and d["identical"], "digest_equal": same,
           "tidemark_table": args.tidemark, "tidemark_rows_total": total, "tidemark_tombstones": tomb,
           "tidemark_schema": schema, "tidemark_live": mine, "truth": truth, "diff": d}
    print(json.dumps(out, indent=1))
    return 0 if out["identical"] else 1


def watermark(args) -> int:
    out = {}
    for spec in args.table:
        name, path = spec.split("=", 1)
        t0 = time.perf_counter()
        t = DeltaTable(path)
        open_ms = (time.perf_counter() - t0) * 1e3
        stats, scan = [], []
        wm_stats = wm_scan = None
        for _ in range(args.reps):
            t0 = time.perf_counter()
            acts = pa.table(t.get_add_actions(flatten=True))
            wm_stats = pc.max(acts.column("max.updated_at")).as_py()
            stats.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            wm_scan = pc.max(t.to_pyarrow_table(columns=["updated_at"]).column("updated_at")).as_py()
            scan.append((time.perf_counter() - t0) * 1e3)
        summ = lambda xs: {"median_ms": round(statistics.median(xs), 3), "min_ms": round(min(xs), 3),
                           "max_ms": round(max(xs), 3)}
        out[name] = {"path": path, "files": len(t.file_uris()), "open_ms": round(open_ms, 1),
                     "stats": summ(stats), "scan": summ(scan),
                     "watermark_stats": str(wm_stats), "watermark_scan": str(wm_scan)}
    print(json.dumps(out, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--peers", required=True)
    c.add_argument("--tidemark", required=True)
    c.add_argument("--truth", required=True)
    c.add_argument("--work", required=True)
    w = sub.add_parser("watermark")
    w.add_argument("--table", action="append", required=True)
    w.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else watermark(args)


if __name__ == "__main__":
    sys.exit(main())
