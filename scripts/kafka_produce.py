"""Produces JSON-lines landing files (e.g. `tidemark generate --landing DIR`) to a Kafka topic,
one message per line, keyed by `payment_id` (a payment's versions stay in one partition, in
order), for the Kafka ingest benchmark (scripts/kafka_bench.sh).

    python scripts/kafka_produce.py --brokers 127.0.0.1:9092 --topic payments FILE...
"""
import argparse
import json
import time

from kafka import KafkaProducer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument(
        "--unbatched",
        action="store_true",
        help="one record per produce request (tansu's in-memory engine keeps offsets per batch)",
    )
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    producer = KafkaProducer(
        bootstrap_servers=args.brokers.split(","),
        linger_ms=0 if args.unbatched else 20,
        batch_size=0 if args.unbatched else 1 << 20,
        acks=1,
    )
    start, n, nbytes = time.time(), 0, 0
    for path in args.files:
        with open(path, "rb") as f:
            for line in f:
                line = line.rstrip(b"\n")
                if not line:
                    continue
                try:
                    key = str(json.loads(line).get("payment_id", "")).encode()
                except (ValueError, AttributeError):
                    key = None  # not a JSON object: sent as it is, without a key
                producer.send(args.topic, key=key, value=line)
                n += 1
                nbytes += len(line)
    producer.flush()
    producer.close()
    print(json.dumps({"records": n, "bytes": nbytes, "seconds": round(time.time() - start, 3)}))


if __name__ == "__main__":
    main()
