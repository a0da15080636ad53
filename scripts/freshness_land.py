#!/usr/bin/env python3
"""Lands payment events continuously for the freshness benchmark (scripts/freshness_bench.sh).

Every second it writes one JSON-lines file of RATE events into LANDING/events/ (written under a
temporary name, then renamed: a reader never sees half a file), each event created up to a few
seconds before it lands (1% of them minutes late), and appends the file's name, landing time and
event count to MANIFEST (CSV). Runs for SECONDS, then stops.

    freshness_land.py LANDING MANIFEST RATE SECONDS
"""
import json
import os
import random
import sys
import time
from datetime import datetime, timezone


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def main() -> None:
    landing, manifest, rate, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    events = os.path.join(landing, "events")
    os.makedirs(events, exist_ok=True)
    rng = random.Random(7)
    n = 0
    start = time.time()
    with open(manifest, "a", encoding="utf-8") as m:
        for tick in range(seconds):
            due = start + tick
            time.sleep(max(0.0, due - time.time()))
            now = time.time()
            lines = []
            for _ in range(rate):
                late = rng.expovariate(1 / 2.0) if rng.random() > 0.01 else rng.uniform(60, 900)
                created = now - late
                lines.append(json.dumps({
                    "payment_id": f"pay_f{n:012d}",
                    "customer_id": f"cus_{rng.randrange(5000):06d}",
                    "merchant_id": f"mch_{rng.randrange(500):06d}",
                    "amount_cents": rng.randrange(100, 100000),
                    "currency": rng.choice(["EUR", "USD", "GBP"]),
                    "status": "created",
                    "created_at": iso(created),
                    "updated_at": iso(created),
                    "op": "U",
                }))
                n += 1
            name = f"{int(now * 1000)}.jsonl"
            tmp = os.path.join(events, "." + name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            os.rename(tmp, os.path.join(events, name))
            m.write(f"events/{name},{iso(time.time())},{rate}\n")
            m.flush()


if __name__ == "__main__":
    main()
