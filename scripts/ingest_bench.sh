#!/usr/bin/env bash
# `tidemark run <ingest pipeline>` side by side with the Python peer (scripts/ingest_peer.py:
# pyarrow.json + deltalake, the plain way) on the same landing files, each run its own process
# under /usr/bin/time (peak RSS), alternating:
#
#   hour    one hour of the event stream (~30k JSON-lines records) into a bronze that already
#           holds a day of files, REPS times (each time a fresh copy of that bronze)
#   bulk    ~1 GB of JSON lines into a new bronze (throughput, MB/s)
#   record  one new hour file with 100k files already recorded (and still in the landing
#           folder), against the same with 1k recorded; and with the 100k recorded files moved
#           out of the landing folder (archived): is the bookkeeping flat?
#
#   scripts/ingest_bench.sh WORKDIR [REPS]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), PEER_PYTHON (an interpreter with
# deltalake and pyarrow; default python3).
set -euo pipefail
work=${1:?usage: scripts/ingest_bench.sh WORKDIR [REPS]}
reps=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PEER_PYTHON:-python3}
mkdir -p "$work"
work=$(cd "$work" && pwd)

pipeline() { # landing table file [extra]
  cat >"$3" <<YML
name: bench
kind: ingest
landing: { uri: "$1", glob: "events/*.jsonl" }
format: json
target: { uri: "$2" }
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
quarantine: { uri: "$2_quarantine" }
${4:-}
YML
}

timed() { # label cmd...
  local label=$1 start end
  shift
  start=$(date +%s%N)
  /usr/bin/time -f %M -o "$work/rss" "$@" >"$work/out.json"
  end=$(date +%s%N)
  local ms=$(((end - start) / 1000000)) rss=$(($(tail -1 "$work/rss") / 1024))
  echo "$label wall_s=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000))) peak_rss_mib=$rss $(head -c 400 "$work/out.json" | tr -d '\n' | grep -o '"num_source_rows_read":[0-9]*\|"rows": [0-9]*\|"num_bytes_read":[0-9]*\|"num_files_skipped":[0-9]*\|"skipped": [0-9]*' | tr '\n' ' ')"
}

# --- hour -------------------------------------------------------------------------------------
H=$work/hour
if [ ! -d "$H/landing" ]; then
  "$bin" generate --landing "$H/landing" --payments 540000 --days 1 >/dev/null
  pipeline "$H/landing" "$H/base_tm" "$H/base.yml"
  "$bin" run "$H/base.yml" >/dev/null
  "$py" "$here/scripts/ingest_peer.py" --landing "$H/landing" --table "$H/base_py" >/dev/null
  "$bin" generate --landing "$H/landing" --next-hour >/dev/null
fi
if [ ! -d "$H/base_tm_ingest_record" ]; then
  # A base from before the record's index: rebuild it without the newest hour (it is measured).
  newest=$(ls "$H/landing/events" | tail -1)
  mv "$H/landing/events/$newest" "$H/$newest"
  rm -rf "$H/base_tm" "$H/base_tm_quarantine"
  pipeline "$H/landing" "$H/base_tm" "$H/base.yml"
  "$bin" run "$H/base.yml" >/dev/null
  mv "$H/$newest" "$H/landing/events/$newest"
fi
echo "hour: $(cat "$H"/landing/events/*.jsonl | wc -l) records in $(ls "$H"/landing/events | wc -l) files; the last hour: $(wc -l <"$(ls -t "$H"/landing/events/*.jsonl | head -1)") records"
for i in $(seq "$reps"); do
  rm -rf "$H/tm" "$H/py" "$H/tm_quarantine" "$H/tm_ingest_record"
  cp -r "$H/base_tm" "$H/tm"
  cp -r "$H/base_tm_ingest_record" "$H/tm_ingest_record"
  cp -r "$H/base_py" "$H/py"
  pipeline "$H/landing" "$H/tm" "$H/tm.yml"
  timed "hour tidemark rep=$i" "$bin" run "$H/tm.yml" --output json
  timed "hour peer rep=$i" "$py" "$here/scripts/ingest_peer.py" --landing "$H/landing" --table "$H/py"
done

# --- bulk -------------------------------------------------------------------------------------
B=$work/bulk
if [ ! -d "$B/landing" ]; then
  "$bin" generate --landing "$B/landing" --payments 1700000 --days 1 >/dev/null
fi
echo "bulk: $(du -sb "$B/landing/events" | cut -f1) bytes of JSON lines in $(ls "$B/landing/events" | wc -l) files"
for i in $(seq "$reps"); do
  rm -rf "$B/tm" "$B/py" "$B/tm_quarantine" "$B/tm_ingest_record"
  pipeline "$B/landing" "$B/tm" "$B/tm.yml"
  timed "bulk tidemark rep=$i" "$bin" run "$B/tm.yml" --output json
  timed "bulk peer rep=$i" "$py" "$here/scripts/ingest_peer.py" --landing "$B/landing" --table "$B/py"
done

# --- record -----------------------------------------------------------------------------------
R=$work/record
for n in 1000 100000; do
  D=$R/$n
  if [ ! -d "$D/landing" ]; then
    mkdir -p "$D/landing/events"
    "$py" - "$D/landing/events" "$n" <<'PY'
import sys, os
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(d, f"f{i:06d}.jsonl"), "w") as f:
        f.write('{"payment_id":"p%d","op":"U","updated_at":"2024-01-01T00:00:00Z","amount_cents":%d}\n' % (i, i))
PY
    cp "$H/landing/events/$(ls "$H/landing/events" | tail -1)" "$D/landing/events/zz-new-hour.jsonl"
  fi
  if [ ! -d "$D/base_ingest_record" ]; then
    # (Re)build the base without the new hour file: n one-record files recorded, compacted and
    # checkpointed by maintain.
    mv "$D/landing/events/zz-new-hour.jsonl" "$D/zz-new-hour.jsonl"
    rm -rf "$D/base" "$D/base_quarantine"
    pipeline "$D/landing" "$D/base" "$D/base.yml"
    "$bin" run "$D/base.yml" >/dev/null
    "$bin" maintain "$D/base.yml" >/dev/null
    mv "$D/zz-new-hour.jsonl" "$D/landing/events/zz-new-hour.jsonl"
  fi
  for i in $(seq "$reps"); do
    rm -rf "$D/tm" "$D/tm_quarantine" "$D/tm_ingest_record"
    cp -r "$D/base" "$D/tm"
    cp -r "$D/base_ingest_record" "$D/tm_ingest_record"
    pipeline "$D/landing" "$D/tm" "$D/tm.yml"
    timed "record recorded=$n tidemark rep=$i" "$bin" run "$D/tm.yml" --output json
  done
done

# The 100k recorded files archived: the landing folder holds only the new file; the record stays.
M=$R/moved
if [ ! -d "$M/landing" ]; then
  mkdir -p "$M/landing/events"
  cp "$R/100000/landing/events/zz-new-hour.jsonl" "$M/landing/events/"
fi
for i in $(seq "$reps"); do
  rm -rf "$M/tm" "$M/tm_quarantine" "$M/tm_ingest_record"
  cp -r "$R/100000/base" "$M/tm"
  cp -r "$R/100000/base_ingest_record" "$M/tm_ingest_record"
  pipeline "$M/landing" "$M/tm" "$M/tm.yml"
  timed "record recorded=100000 archived tidemark rep=$i" "$bin" run "$M/tm.yml" --output json
done
