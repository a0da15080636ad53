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


def layout(args) -> int:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    def src(path):
        return "read_parquet([" + ",".join("'" + f + "'" for f in DeltaTable(path).file_uris()) + "])"

    con.execute(f"CREATE TEMP TABLE a AS SELECT * FROM {src(args.before)}")
    con.execute(f"CREATE TEMP TABLE b AS SELECT * FROM {src(args.after)}")
    cols = [c for c in ("customer_id", "merchant_id", "amount_cents", "currency", "status", "created_at",
                        "updated_at", "_ingested_at")]
    cmp = " OR ".join(f"a.{c} IS DISTINCT FROM b.{c}" for c in cols)
    hour_start = con.execute("SELECT max(updated_at) FROM a").fetchone()[0]  # ~ where the hour starts
    con.execute(f"""CREATE TEMP TABLE ch AS
        SELECT coalesce(b.payment_id, a.payment_id) AS payment_id,
               CASE WHEN a.payment_id IS NULL THEN 'inserted' WHEN b.payment_id IS NULL THEN 'deleted'
                    ELSE 'updated' END AS kind,
               coalesce(b.created_at, a.created_at) AS created_at
        FROM a FULL OUTER JOIN b USING (payment_id)
        WHERE a.payment_id IS NULL OR b.payment_id IS NULL OR ({cmp})""")
    n_rows = con.execute("SELECT count(*) FROM b").fetchone()[0]
    kinds = dict(con.execute("SELECT kind, count(*) FROM ch GROUP BY ALL").fetchall())
    hs = "TIMESTAMPTZ '" + str(hour_start) + "'"
    age = con.execute(f"""SELECT count(*) FILTER (WHERE created_at >= {hs} - INTERVAL 1 HOUR),
                                 count(*) FILTER (WHERE created_at < {hs} - INTERVAL 1 HOUR AND created_at >= {hs} - INTERVAL 1 DAY),
                                 count(*) FILTER (WHERE created_at < {hs} - INTERVAL 1 DAY AND created_at >= {hs} - INTERVAL 7 DAY),
                                 count(*) FILTER (WHERE created_at < {hs} - INTERVAL 7 DAY)
                          FROM ch""").fetchone()
    # rank of every key of the after-table in key order; changed keys that were deleted keep the
    # rank of their neighbour (their file is rewritten all the same)
    con.execute("""CREATE TEMP TABLE r AS SELECT payment_id, row_number() OVER (ORDER BY payment_id) - 1 AS rk FROM
                   (SELECT payment_id FROM b UNION SELECT payment_id FROM ch)""")
    total = con.execute("SELECT count(*) FROM r").fetchone()[0]
    sims = []
    for n in args.files:
        per = max(1, -(-total // n))
        touched, changed_in = con.execute(
            f"SELECT count(DISTINCT rk // {per}), count(*) FROM ch JOIN r USING (payment_id)").fetchone()
        touched_old = con.execute(
            f"""SELECT count(DISTINCT rk // {per}) FROM ch JOIN r USING (payment_id)
                WHERE created_at < {hs} - INTERVAL 1 DAY""").fetchone()[0]
        recent = con.execute(
            f"""SELECT count(DISTINCT rk // {per}) FROM ch JOIN r USING (payment_id)
                WHERE created_at >= {hs} - INTERVAL 1 DAY""").fetchone()[0]
        rows_in = con.execute(
            f"""SELECT count(*) FROM r WHERE rk // {per} IN
                (SELECT DISTINCT rk // {per} FROM ch JOIN r USING (payment_id))""").fetchone()[0]
        sims.append({"files": n, "rows_per_file": per, "files_touched": touched,
                     "files_touched_by_keys_older_than_1d": touched_old,
                     "files_touched_by_keys_of_the_last_day": recent,
                     "rows_copied": rows_in - changed_in, "fraction_rewritten": round(rows_in / total, 4)})
    out = {"before": args.before, "after": args.after, "target_rows_after": n_rows,
           "changed_keys": sum(kinds.values()), "by_kind": kinds,
           "changed_keys_by_age": {"created_in_the_hour_or_the_one_before": age[0], "1h_to_1d": age[1],
                                   "1d_to_7d": age[2], "older_than_7d": age[3]},
           "simulated_key_sorted_layouts": sims}
    print(json.dumps(out, indent=1, default=str))
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
    lay = sub.add_parser("layout")
    lay.add_argument("--before", required=True)
    lay.add_argument("--after", required=True)
    lay.add_argument("--files", type=int, nargs="+", default=[1, 8, 32, 128, 512, 2048, 8192])
    args = ap.parse_args()
    return {"check": check, "watermark": watermark, "layout": layout}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
