#!/usr/bin/env python3
"""Readers and figures for scripts/apply_bench.sh.

  apply_check.py digest NAME=TABLE...   every table read by DuckDB's delta extension (delta-kernel-rs)
                                        and, when installed, the deltalake package: rows, an
                                        order-free digest of every column, and whether all agree
  apply_check.py reads NAME=TABLE...    DuckDB count(*) and a point lookup, median of 5 each
  apply_check.py summary RESULTS_DIR    medians of the hourly runs per mode, as JSON and a table

DuckDB's delta extension comes from the `duckdb-extension-delta` wheel (PyPI) next to the matching
`duckdb` (1.5.5 here), loaded from its file: this machine cannot reach extensions.duckdb.org.
"""
import glob
import json
import os
import re
import statistics
import sys
import time


def duck():
    import duckdb
    import duckdb_extension_delta

    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__),
                                 "extensions", "*", "delta.duckdb_extension"))[0]
    c = duckdb.connect()
    c.execute(f"LOAD '{ext}'")
    return c


def tables(args):
    return [a.split("=", 1) for a in args]


def digest(args):
    c = duck()
    out = {}
    for name, path in tables(args):
        cols = [r[0] for r in c.execute(f"describe select * from delta_scan('{path}')").fetchall()]
        expr = ", ".join(f'"{x}"' for x in sorted(cols))
        n, h = c.execute(
            f"select count(*), sum(hash({expr})::hugeint) from delta_scan('{path}')").fetchone()
        out[name] = {"duckdb_rows": n, "duckdb_digest": str(h)}
        try:
            from deltalake import DeltaTable, QueryBuilder
            import pyarrow as pa
            t = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute(
                "select count(*) as n, count(distinct payment_id) as k, sum(amount_cents) as s from t"
            ).read_all())
            row = t.to_pylist()[0]
            out[name].update({"deltalake_rows": row["n"], "deltalake_keys": row["k"],
                              "deltalake_amount": row["s"]})
        except ImportError:
            pass
    first = next(iter(out.values()))
    out["all_equal"] = all(v == first for k, v in out.items() if k != "all_equal")
    print(json.dumps(out, indent=1))
    return 0 if out["all_equal"] else 1


def reads(args):
    c = duck()
    out = {}
    for name, path in tables(args):
        key = c.execute(f"select payment_id from delta_scan('{path}') limit 1 offset 12345").fetchone()[0]
        res = {}
        for what, sql in [("count", f"select count(*) from delta_scan('{path}')"),
                          ("lookup", f"select * from delta_scan('{path}') where payment_id = '{key}'")]:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                c.execute(sql).fetchall()
                times.append(time.perf_counter() - t0)
            res[what + "_s"] = statistics.median(times)
        files = len(glob.glob(os.path.join(path, "*.parquet")))
        res["parquet_files_on_disk"] = files
        out[name] = res
    print(json.dumps(out, indent=1))


def seconds(time_file):
    text = open(time_file).read()
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", text)
    h, mnt, s = m.groups()
    wall = int(h or 0) * 3600 + int(mnt) * 60 + float(s)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return wall, rss / 1024


def summary(args):
    res = args[0]
    rows = {}
    for mode in ("cow", "dv"):
        runs = []
        for f in sorted(glob.glob(os.path.join(res, f"{mode}_hour_*.json"))):
            s = json.load(open(f))
            wall, rss = seconds(f[:-5] + ".time")
            rerun = json.load(open(f.replace("_hour_", "_rerun_")))
            changed = s["num_inserted"] + s["num_updated"] + s["num_deleted"]
            runs.append({"wall_s": wall, "rss_mib": rss, "changed": changed,
                         "rows_written": s["num_rows_written"],
                         "rows_marked": s["num_rows_marked_deleted"],
                         "files_rewritten_or_marked": s["num_files_removed"] + s["num_files_marked"],
                         "files_candidate": s["num_files_candidate"],
                         "rerun_committed": rerun["target_version"] is not None,
                         "phases_ms": s["phases_ms"]})
        if not runs:
            continue
        med = statistics.median(r["wall_s"] for r in runs)
        r0 = runs[0]
        rows[mode] = {"median_wall_s": med, "walls": [r["wall_s"] for r in runs],
                      "max_rss_mib": max(r["rss_mib"] for r in runs),
                      "changed_keys": r0["changed"], "rows_written": r0["rows_written"],
                      "rows_written_per_changed_key": r0["rows_written"] / max(r0["changed"], 1),
                      "rows_marked": r0["rows_marked"],
                      "files_rewritten_or_marked": r0["files_rewritten_or_marked"],
                      "files_candidate": r0["files_candidate"],
                      "ms_per_changed_key": 1000 * med / max(r0["changed"], 1),
                      "any_rerun_committed": any(r["rerun_committed"] for r in runs),
                      "phases_ms_first": r0["phases_ms"]}
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    sys.exit({"digest": digest, "reads": reads, "summary": summary}[cmd](rest) or 0)
