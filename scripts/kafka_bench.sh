#!/usr/bin/env bash
# Kafka -> bronze: `tidemark run <kafka ingest>` side by side with the Python peer
# (scripts/kafka_peer.py: kafka-python + deltalake, offsets in the same commit), on one topic of
# a local tansu broker (in-memory engine, 3 partitions), each run into a new table, alternating
# (farm-bench --vs: medians and pair-by-pair ratios, peak RSS).
#
#   scripts/kafka_bench.sh WORKDIR [PAYMENTS] [RUNS]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), TANSU (default
# target/tools/bin/tansu, what scripts/test.sh installs), KAFKA_VENV (a venv with kafka-python
# 2.0.2, deltalake 1.6.6 and pyarrow; created there when missing, default /work/bench/.venv-kafka).
set -euo pipefail
work=${1:?usage: scripts/kafka_bench.sh WORKDIR [PAYMENTS] [RUNS]}
payments=${2:-100000}
runs=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
tansu=${TANSU:-$here/target/tools/bin/tansu}
venv=${KAFKA_VENV:-/work/bench/.venv-kafka}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import kafka, deltalake" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q kafka-python==2.0.2 deltalake==1.6.6 pyarrow >&2
fi
py=$venv/bin/python
mkdir -p "$work"
work=$(cd "$work" && pwd)
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
  --storage-engine memory://tansu/ --silent >"$work/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null || true' EXIT
for _ in $(seq 50); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
"$tansu" topic create payments --broker "tcp://127.0.0.1:$port" --partitions 3 >/dev/null
rm -rf "$work/landing"
"$bin" generate --landing "$work/landing" --payments "$payments" --days 1 >/dev/null
echo "produce: $("$py" "$here/scripts/kafka_produce.py" --unbatched --brokers "127.0.0.1:$port" --topic payments "$work"/landing/events/*.jsonl)"
cat >"$work/kafka.yml" <<YML
name: bench_kafka
kind: ingest
kafka: { brokers: ["127.0.0.1:$port"], topic: payments, start: earliest }
format: json
target: { uri: "$work/tm" }
schema:
  payment_id: string not null
  customer_id: string
  merchant_id: string
  amount_cents: long
  currency: string
  status: string
  created_at: timestamp
  updated_at: timestamp not null
  op: string not null
quarantine: { uri: "$work/tm_quarantine" }
YML
farm-bench -n "$runs" --timeout 1200 \
  --vs "sh -c 'rm -rf $work/py && exec $py $here/scripts/kafka_peer.py --brokers 127.0.0.1:$port --topic payments --table $work/py >/dev/null'" \
  -- sh -c "rm -rf $work/tm $work/tm_quarantine $work/tm_ingest_record && exec $bin run $work/kafka.yml >/dev/null"
"$bin" run "$work/kafka.yml" --output json | "$py" -c 'import json,sys; s=json.load(sys.stdin); print("rerun:", s.get("target_version"), "(null: nothing new)")'
"$py" - "$work" <<'PY'
import sys
from deltalake import DeltaTable
w = sys.argv[1]
for t in ("tm", "py"):
    d = DeltaTable(f"{w}/{t}")
    print(t, "rows", d.to_pyarrow_table().num_rows)
PY
