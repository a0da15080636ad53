"""The Kafka peer: a topic -> a bronze Delta table, as a Python user writes it with kafka-python
and the deltalake package (the baseline a Kafka `kind: ingest` run is compared with).

It does what kafka-delta-ingest and tidemark do, in the plain way: for each partition, read the
next offset from the table's application transactions (`kafka-peer/<topic>/<partition>`, the
offset after the last record written), fetch until caught up (or --max-records), parse
each value as JSON into the declared columns, add the Kafka columns and `_ingested_at`, and append
everything in one write whose commit also records every partition's next offset — so a crash
never duplicates or loses a record. No per-record quarantine: a bad value fails the run.

    python scripts/kafka_peer.py --brokers 127.0.0.1:9092 --topic payments --table PATH
"""
import argparse
import datetime as dt
import json
import time

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from kafka import KafkaConsumer, TopicPartition

TS = pa.timestamp("us", tz="UTC")
COLUMNS = [
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


def app_id(topic, partition):
    return f"kafka-peer/{topic}/{partition}"


def recorded_offsets(table_uri, topic, partitions):
    try:
        table = DeltaTable(table_uri)
    except Exception:
        return {p: 0 for p in partitions}
    out = {}
    for p in partitions:
        v = table.transaction_version(app_id(topic, p))
        out[p] = v if v is not None else 0
    return out


def to_micros(text):
    if text is None:
        return None
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1_000_000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--max-records", type=int, default=None)
    args = ap.parse_args()
    start = time.time()
    consumer = KafkaConsumer(
        bootstrap_servers=args.brokers.split(","),
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=2000,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    partitions = sorted(consumer.partitions_for_topic(args.topic) or [])
    tps = [TopicPartition(args.topic, p) for p in partitions]
    consumer.assign(tps)
    offsets = recorded_offsets(args.table, args.topic, partitions)
    for tp in tps:
        consumer.seek(tp, offsets[tp.partition])
    cols = {name: [] for name, _ in COLUMNS}
    kafka_cols = {"_kafka_partition": [], "_kafka_offset": [], "_kafka_timestamp": []}
    next_offset = dict(offsets)
    budget = args.max_records
    nbytes = 0
    # Until a poll brings nothing (caught up: the fetches' high watermarks), or the budget.
    while budget is None or budget > 0:
        batch = consumer.poll(timeout_ms=1000, max_records=100_000)
        if not batch:
            break
        for tp, records in batch.items():
            for r in records:
                if budget is not None and budget <= 0:
                    break
                next_offset[tp.partition] = r.offset + 1
                if r.value is None:
                    continue
                nbytes += len(r.value)
                v = json.loads(r.value)
                for name, ty in COLUMNS:
                    x = v.get(name)
                    cols[name].append(to_micros(x) if ty == TS else x)
                kafka_cols["_kafka_partition"].append(tp.partition)
                kafka_cols["_kafka_offset"].append(r.offset)
                kafka_cols["_kafka_timestamp"].append(r.timestamp * 1000)
                if budget is not None:
                    budget -= 1
    consumer.close()
    n = len(cols["payment_id"])
    if n == 0:
        print(json.dumps({"rows": 0, "seconds": round(time.time() - start, 3)}))
        return
    now = int(time.time() * 1000) * 1000
    arrays = [pa.array(cols[name], type=ty) for name, ty in COLUMNS]
    arrays += [
        pa.array(kafka_cols["_kafka_partition"], type=pa.int32()),
        pa.array(kafka_cols["_kafka_offset"], type=pa.int64()),
        pa.array(kafka_cols["_kafka_timestamp"], type=TS),
        pa.array([now] * n, type=TS),
    ]
    names = [name for name, _ in COLUMNS] + [
        "_kafka_partition",
        "_kafka_offset",
        "_kafka_timestamp",
        "_ingested_at",
    ]
    table = pa.Table.from_arrays(arrays, names=names)
    txns = [Transaction(app_id(args.topic, p), o) for p, o in next_offset.items() if o != offsets[p]]
    write_deltalake(
        args.table,
        table,
        mode="append",
        commit_properties=CommitProperties(app_transactions=txns),
    )
    print(json.dumps({"rows": n, "bytes": nbytes, "seconds": round(time.time() - start, 3)}))


if __name__ == "__main__":
    main()
