"""The ingest peer: landing files -> a bronze Delta table, as a Python user writes it with the
deltalake package and pyarrow (the baseline `tidemark run <ingest pipeline>` is compared with).

It does what tidemark's ingest does, in the plain way: list the landing folder, skip the files
already in bronze (the distinct `_source_file` values of the table), read the new JSON-lines files
with pyarrow.json into the declared schema, add `_ingested_at` (one per run) and `_source_file`,
and append them in one write. No per-record quarantine: a bad line fails pyarrow's read.

    python scripts/ingest_peer.py --landing DIR --glob 'events/*.jsonl' --table PATH
"""
import argparse
import datetime as dt
import glob
import json
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from deltalake import DeltaTable, write_deltalake

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("payment_id", pa.string()),
        ("customer_id", pa.string()),
        ("merchant_id", pa.string()),
        ("amount_cents", pa.int64()),
        ("currency", pa.string()),
        ("status", pa.string()),
        ("created_at", TS),
        ("updated_at", TS),
        ("op", pa.string()),
    ]
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--landing", required=True)
    ap.add_argument("--glob", default="events/*.jsonl")
    ap.add_argument("--table", required=True)
    a = ap.parse_args()
    t0 = time.time()
    root = os.path.abspath(a.landing)
    files = sorted(glob.glob(os.path.join(root, a.glob)))
    seen = set()
    if os.path.isdir(os.path.join(a.table, "_delta_log")):
        t = DeltaTable(a.table)
        col = t.to_pyarrow_dataset().to_table(columns=["_source_file"]).column(0)
        seen = set(pc.unique(col).to_pylist())
    new = [f for f in files if "file://" + f not in seen]
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    opts = pj.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore")
    parts = []
    rows = 0
    for f in new:
        tbl = pj.read_json(f, parse_options=opts)
        n = tbl.num_rows
        tbl = tbl.append_column("_ingested_at", pa.array([now] * n, type=TS))
        tbl = tbl.append_column("_source_file", pa.array(["file://" + f] * n, type=pa.string()))
        parts.append(tbl)
        rows += n
    if parts:
        write_deltalake(a.table, pa.concat_tables(parts), mode="append")
    print(json.dumps({"files": len(new), "skipped": len(files) - len(new), "rows": rows,
                      "seconds": round(time.time() - t0, 3)}))


if __name__ == "__main__":
    main()
