#!/usr/bin/env python3
"""Peer for gold by tumbling window (seeds 002/003), as a Python user writes it: DuckDB buckets
silver payments (read with the deltalake package) into WINDOW-minute windows of UTC time per
currency, and deltalake replaces the last N days of them in one commit (`predicate` overwrite);
`--full` rebuilds every window. Windows of UTC time: the peer has no time zone (tidemark's
windows are the same when its pipeline's zone is UTC).

  windows_peer.py --silver PATH --gold PATH --logical-date YYYY-MM-DD --window 5 [--lookback 3] [--full]
"""
import argparse, datetime as dt, json, resource, time

import duckdb
from deltalake import DeltaTable, write_deltalake

ap = argparse.ArgumentParser()
ap.add_argument("--silver", required=True)
ap.add_argument("--gold", required=True)
ap.add_argument("--logical-date", required=True)
ap.add_argument("--window", type=int, required=True)
ap.add_argument("--lookback", type=int, default=3)
ap.add_argument("--full", action="store_true")
a = ap.parse_args()
t0 = time.perf_counter()
logical = dt.date.fromisoformat(a.logical_date)
start = logical - dt.timedelta(days=a.lookback)
silver = DeltaTable(a.silver)
cols = [f.name for f in silver.schema().fields]
con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
con.register("silver", silver.to_pyarrow_dataset())
live = "NOT coalesce(_deleted, false)" if "_deleted" in cols else "true"
days = "true" if a.full else f"CAST(created_at AS DATE) BETWEEN DATE '{start}' AND DATE '{logical}'"
w = f"time_bucket(INTERVAL {a.window} MINUTE, created_at)"
rows = con.sql(f"""
  SELECT CAST(created_at AS DATE) AS event_date, {w} AS window_start,
         {w} + INTERVAL {a.window} MINUTE AS window_end, currency,
         count(*) AS payments, CAST(sum(amount_cents) AS BIGINT) AS amount_cents,
         max(_ingested_at) AS data_as_of
  FROM silver WHERE {live} AND {days}
  GROUP BY ALL ORDER BY window_start, currency""").to_arrow_table()
if a.full:
    write_deltalake(a.gold, rows, mode="overwrite", partition_by=["event_date"])
else:
    write_deltalake(a.gold, rows, mode="overwrite",
                    predicate=f"event_date >= '{start}' AND event_date <= '{logical}'")
print(json.dumps({
    "rows_written": rows.num_rows, "full": a.full,
    "total_s": round(time.perf_counter() - t0, 4),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
}))
