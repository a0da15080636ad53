#!/usr/bin/env bash
# Freshness (issue 33 item 5): payment events land continuously (RATE per second, one JSON-lines
# file a second, scripts/freshness_land.py) while `tidemark job run stream --every PERIOD` runs
# ingest -> cdc_merge -> a 1-minute-window aggregate final by the watermark; then it is stopped
# with SIGINT, and scripts/freshness_report.py gives, per event, the time from its file's landing
# to the end of the job run that put it in gold (p50 / p99), beside what the hourly schedule
# gives the same events; and the live file count of every table.
#
#   scripts/freshness_bench.sh WORK [RATE] [SECONDS] [PERIOD]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), PY (a python with deltalake;
# default /work/bench/.venv/bin/python).
set -euo pipefail
work=${1:?usage: scripts/freshness_bench.sh WORK [RATE] [SECONDS] [PERIOD]}
rate=${2:-1000}
seconds=${3:-600}
period=${4:-30s}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PY:-/work/bench/.venv/bin/python}
rm -rf "$work"; mkdir -p "$work/pipelines" "$work/bundle/resources"; work=$(cd "$work" && pwd)
l="$work/lake"
cat >"$work/pipelines/events.yml" <<YML
name: events
kind: ingest
landing: { uri: "$l/landing/payments", glob: "events/*.jsonl" }
format: json
target: { uri: "$l/bronze" }
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
quarantine: { uri: "$l/quarantine/landing" }
YML
cat >"$work/pipelines/payments.yml" <<YML
name: payments
kind: cdc_merge
source: { uri: "$l/bronze" }
target: { uri: "$l/silver" }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "$l/quarantine/payments" }
YML
cat >"$work/pipelines/minutes.yml" <<YML
name: minutes
kind: aggregate
source: { uri: "$l/silver" }
target: { uri: "$l/gold/minutes" }
event_date: { column: created_at, time_zone: UTC }
window: 1m
group_by: [currency]
measures:
  - { name: payments, agg: count }
  - { name: amount_cents, agg: sum, column: amount_cents }
watermark: { delay: 1m, allowed_lateness: 1m }
after_close: adjust
YML
cat >"$work/bundle/tidemark.yml" <<YML
bundle: { name: freshness }
include: [resources/*.yml]
variables:
  lake: { description: the lake }
targets:
  local:
    default: true
    variables: { lake: "$l" }
YML
cat >"$work/bundle/resources/jobs.yml" <<YML
resources:
  jobs:
    stream:
      tasks:
        - task_key: ingest
          pipeline_task: { pipeline: "$work/pipelines/events.yml" }
        - task_key: merge
          depends_on: [{ task_key: ingest }]
          pipeline_task: { pipeline: "$work/pipelines/payments.yml" }
        - task_key: gold
          depends_on: [{ task_key: merge }]
          pipeline_task: { pipeline: "$work/pipelines/minutes.yml" }
YML
mkdir -p "$l/landing/payments/events"
"$py" "$here/scripts/freshness_land.py" "$l/landing/payments" "$work/manifest.csv" "$rate" "$seconds" &
lander=$!
# (the loop starts once the first file is there: a merge whose bronze does not exist yet fails
# with 66, which stops a continuous loop)
until ls "$l/landing/payments/events/"*.jsonl >/dev/null 2>&1; do sleep 0.2; done
/usr/bin/time -v -o "$work/time.txt" "$bin" job run stream --bundle "$work/bundle" --every "$period" --output json >"$work/runs.jsonl" 2>"$work/stderr.txt" &
runner=$!
wait "$lander"
sleep 45   # the files landed last are taken by the next run
kill -INT "$(pgrep -P "$runner")"; wait "$runner" || true   # (SIGINT to tidemark: time(1) ignores it)
"$bin" runs --bundle "$work/bundle" --job stream --limit 100000 --output json >"$work/ledger.json"
echo "== latency: landing -> gold (continuous every $period) vs the hourly schedule"
"$py" "$here/scripts/freshness_report.py" "$work/manifest.csv" "$l/bronze" "$work/ledger.json" ingest gold
echo "== live files per table after ${seconds}s (compaction in step: --compact-after default)"
for t in bronze silver gold/minutes gold/minutes_status gold/minutes_adjustments; do
  [ -d "$l/$t" ] && "$py" -c "import sys; from deltalake import DeltaTable; print(sys.argv[1], len(DeltaTable(sys.argv[2]).file_uris()))" "$t" "$l/$t"
done
echo "== the job's process: $(grep -E 'Maximum resident|Elapsed' "$work/time.txt" | tr -s ' ' | tr '\n' ';')"
grep -c '"run_id"' "$work/runs.jsonl" | sed 's/^/job runs printed: /'
