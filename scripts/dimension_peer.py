#!/usr/bin/env python3
"""The SCD2 dimension peer for scripts/dimension_bench.sh, written as deltalake users write it.

  dimension_peer.py gen BRONZE --merchants N --changes K [--seed S]
      Bronze merchants change records: N merchants' first records (version 0), then one hour of
      K changes (version 1): 70% change only the name (untracked), 30% the segment.
  dimension_peer.py bootstrap BRONZE TARGET
      The SCD2 table from version 0: every merchant one current version.
  dimension_peer.py hourly BRONZE TARGET
      The hour (bronze version 1) applied in two statements: a MERGE that closes the current
      version of each merchant whose tracked columns changed, then an append of the new
      versions (untracked changes update the current version in place, as the MERGE's second
      clause). Prints the wall time.
"""
from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

SEGMENTS = ["micro", "small", "mid", "large", "enterprise"]
COUNTRIES = ["NL", "DE", "FR", "BE", "ES", "IT", "PL", "SE", "DK", "FI", "AT", "PT", "IE", "CZ",
             "RO", "GR", "HU", "SK", "SI", "LU"]
T0 = dt.datetime(2024, 12, 31, tzinfo=dt.timezone.utc)
SCHEMA = pa.schema([
    ("merchant_id", pa.string()), ("updated_at", pa.timestamp("us", tz="UTC")),
    ("_ingested_at", pa.timestamp("us", tz="UTC")), ("name", pa.string()),
    ("segment", pa.string()), ("country", pa.string()), ("op", pa.string())])


def plain(t: pa.Table) -> pa.Table:
    """`t` with string views as plain strings (pyarrow's joins take no views)."""
    return t.cast(pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type)
                             for f in t.schema]))


def gen(a) -> None:
    r = random.Random(a.seed)
    n = a.merchants
    first = {
        "merchant_id": [f"m{i:07d}" for i in range(n)],
        "updated_at": [T0 - dt.timedelta(seconds=r.randrange(365 * 86400)) for _ in range(n)],
        "name": [f"Merchant {i}" for i in range(n)],
        "segment": [r.choice(SEGMENTS) for _ in range(n)],
        "country": [r.choice(COUNTRIES) for _ in range(n)],
        "op": ["U"] * n,
    }
    first["_ingested_at"] = [T0] * n
    write_deltalake(a.bronze, pa.table(first, schema=SCHEMA), mode="overwrite")
    picked = r.sample(range(n), a.changes)
    hour = {k: [] for k in SCHEMA.names}
    for i in picked:
        seg_change = r.random() < 0.3
        hour["merchant_id"].append(f"m{i:07d}")
        hour["updated_at"].append(T0 + dt.timedelta(seconds=r.randrange(3600)))
        hour["_ingested_at"].append(T0 + dt.timedelta(hours=1))
        hour["name"].append(f"Merchant {i} v2")
        hour["segment"].append(r.choice(SEGMENTS) if seg_change else first["segment"][i])
        hour["country"].append(first["country"][i])
        hour["op"].append("U")
    write_deltalake(a.bronze, pa.table(hour, schema=SCHEMA), mode="append")


def bootstrap(a) -> None:
    dt0 = DeltaTable(a.bronze, version=0)
    t = dt0.to_pyarrow_table()
    out = t.drop(["op"]).append_column("valid_from", t["updated_at"]) \
        .append_column("valid_to", pa.nulls(t.num_rows, pa.timestamp("us", tz="UTC"))) \
        .append_column("is_current", pa.array([True] * t.num_rows))
    write_deltalake(a.target, out.sort_by("merchant_id"), mode="overwrite")


def hourly(a) -> None:
    started = time.perf_counter()
    bronze = DeltaTable(a.bronze)
    # the hour: what landed after the previous run (the peer keeps its own bookmark: version 0)
    hour = plain(pa.table(bronze.load_cdf(starting_version=1).read_all())
                 .select(SCHEMA.names).drop(["op"]))
    target = DeltaTable(a.target)
    current = plain(pa.table(target.to_pyarrow_dataset().to_table(
        filter=(pc.field("is_current") == True),  # noqa: E712
        columns=["merchant_id", "segment", "country"])))
    joined = hour.join(current, "merchant_id", join_type="left outer", right_suffix="_t")
    tracked = pc.or_(pc.not_equal(joined["segment"], joined["segment_t"]),
                     pc.not_equal(joined["country"], joined["country_t"]))
    tracked = pc.fill_null(tracked, True)
    changed = joined.filter(tracked).select(hour.column_names)
    untracked = joined.filter(pc.invert(tracked)).select(hour.column_names)
    # statement 1: close the current version of tracked changes, update untracked in place
    source = pa.concat_tables([
        changed.append_column("__tracked", pa.array([True] * changed.num_rows)),
        untracked.append_column("__tracked", pa.array([False] * untracked.num_rows)),
    ])
    (target.merge(source, "t.merchant_id = s.merchant_id AND t.is_current = true",
                  source_alias="s", target_alias="t")
        .when_matched_update(updates={"valid_to": "s.updated_at", "is_current": "false"},
                             predicate="s.__tracked = true")
        .when_matched_update(updates={"name": "s.name", "updated_at": "s.updated_at",
                                      "_ingested_at": "s._ingested_at"},
                             predicate="s.__tracked = false")
        .execute())
    # statement 2: append the new versions
    new = changed.append_column("valid_from", changed["updated_at"]) \
        .append_column("valid_to", pa.nulls(changed.num_rows, pa.timestamp("us", tz="UTC"))) \
        .append_column("is_current", pa.array([True] * changed.num_rows))
    write_deltalake(DeltaTable(a.target), new, mode="append")
    print(f"{time.perf_counter() - started:.3f}")


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen"); g.add_argument("bronze"); g.add_argument("--merchants", type=int, default=1_000_000)
    g.add_argument("--changes", type=int, default=2083); g.add_argument("--seed", type=int, default=42)
    b = sub.add_parser("bootstrap"); b.add_argument("bronze"); b.add_argument("target")
    h = sub.add_parser("hourly"); h.add_argument("bronze"); h.add_argument("target")
    a = p.parse_args()
    {"gen": gen, "bootstrap": bootstrap, "hourly": hourly}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
