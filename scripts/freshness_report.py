#!/usr/bin/env python3
"""The freshness benchmark's figures (scripts/freshness_bench.sh): for every event landed, the
time from its file's landing to the end of the job run that put it in gold (the ingest, the
merge and the windowed aggregate run one after the other in one job run), p50 / p99 over events;
beside it what the hourly schedule gives the same events (the next :05 fire, plus the job's
median run time).

    freshness_report.py MANIFEST BRONZE RUNS_JSON INGEST_TASK GOLD_TASK
"""
import csv
import json
import statistics
import sys
from datetime import datetime, timedelta


def ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    manifest, bronze, runs_json, ingest_task, gold_task = sys.argv[1:6]
    from deltalake import DeltaTable

    landed = {}
    with open(manifest, encoding="utf-8") as f:
        for name, at, n in csv.reader(f):
            landed[name] = (ts(at), int(n))
    t = DeltaTable(bronze).to_pyarrow_table(columns=["_source_file", "_ingested_at"])
    ingested = {}
    for name, at in zip(t.column("_source_file").to_pylist(), t.column("_ingested_at").to_pylist()):
        key = name.split("payments/", 1)[-1] if "payments/" in name else name
        ingested.setdefault(key, at)
    runs = json.load(open(runs_json, encoding="utf-8"))
    ingests = [r for r in runs if r["task"] == ingest_task and r["status"] == "succeeded"]
    golds = {r["run_id"]: ts(r["ended_at"]) for r in runs if r["task"] == gold_task and r["status"] == "succeeded"}
    durations = []
    for r in runs:
        if r["task"] == gold_task and r["run_id"] in golds:
            first = min(ts(x["started_at"]) for x in runs if x["run_id"] == r["run_id"])
            durations.append((golds[r["run_id"]] - first).total_seconds())
    lat, missing = [], 0
    for name, (at, n) in landed.items():
        when = ingested.get(name)
        run = None
        if when is not None:
            for r in ingests:
                if ts(r["started_at"]) - timedelta(seconds=1) <= when <= ts(r["ended_at"]) + timedelta(seconds=1):
                    run = r["run_id"]
                    break
        if run is None or run not in golds:
            missing += n
            continue
        lat.extend([(golds[run] - at).total_seconds()] * n)
    runtime = statistics.median(durations) if durations else 0.0
    # hourly: an event landing uniformly within the hour waits for the next :05 fire
    hourly_p50 = 30 * 60 + runtime
    hourly_p99 = 0.99 * 60 * 60 + runtime
    print(json.dumps({
        "events": sum(n for _, n in landed.values()),
        "events_not_in_gold": missing,
        "job_runs": len(golds),
        "job_run_median_s": round(runtime, 2),
        "continuous_p50_s": round(pct(lat, 0.50), 2) if lat else None,
        "continuous_p99_s": round(pct(lat, 0.99), 2) if lat else None,
        "hourly_p50_s": round(hourly_p50, 1),
        "hourly_p99_s": round(hourly_p99, 1),
    }))


if __name__ == "__main__":
    main()
