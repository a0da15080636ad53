#!/usr/bin/env bash
# Gold by event day (kind: aggregate) against the seed-001 peer (DuckDB aggregates the last N
# days of silver, the deltalake package replaces them with a predicate overwrite), on the same
# silver, side by side:
#   full      every day restated (tidemark bootstrap of three pipelines; the peer's --full)
#   hourly    silver gets the next hour (a tidemark merge, the feed on), then per rep, on fresh
#             hard-link copies of the gold built before that hour: tidemark `window` (lookback 3d,
#             max_lookback 3d: the 4 days the peer recomputes), `lookback` (lookback 3d; closed
#             days the hour changed, within 35 days, restated too), `touched` (only the changed
#             days), and the peer's lookback-3 run.
#
#   scripts/aggregate_bench.sh SILVER_BASE BRONZE WORKDIR [REPS]
#
# SILVER_BASE: a silver with the change data feed, built by scripts/cdf_bench.sh
# (WORK/base/feed); BRONZE: that script's bronze, which holds the next hour (WORK/bronze).
# Environment: TIDEMARK_BIN, PY (a python with deltalake and duckdb), SHARED_DIR,
# LOGICAL_DATE (default 2024-12-31, the generated year's last day).
set -euo pipefail
base=${1:?usage: scripts/aggregate_bench.sh SILVER_BASE BRONZE WORKDIR [REPS]}
bronze=${2:?usage}
work=${3:?usage}
reps=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PY:-/work/bench/.venv/bin/python}
shared=${SHARED_DIR:-$here/../shared}
day=${LOGICAL_DATE:-2024-12-31}
mkdir -p "$work"; work=$(cd "$work" && pwd)
gold() { # name recompute
  cat >"$work/$1.yml" <<YML
name: daily_$1
kind: aggregate
source: { uri: "$work/silver" }
target: { uri: "$work/gold_$1" }
event_date: { column: created_at, time_zone: UTC }
group_by: [merchant_id, currency]
measures:
  - { name: payments, agg: count }
  - { name: amount_cents, agg: sum, column: amount_cents }
  - { name: refunds, agg: count, filter: "status = 'refunded'" }
recompute: $2
YML
}
gold window "{ lookback: 3d, max_lookback: 3d }"
gold lookback "{ lookback: 3d }"
gold touched "{ lookback: 3d, touched: true }"
cat >"$work/merge.yml" <<YML
name: feed
kind: cdc_merge
source: { uri: "$bronze" }
target: { uri: "$work/silver", change_data_feed: true }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "$work/quarantine" }
YML
cd "$work"
rm -rf silver gold_* peer_gold* base; mkdir base
cp -al "$base" silver
for m in window lookback touched; do
  /usr/bin/time -f "full tidemark_$m %e s %M KiB" "$bin" run "$m.yml" --logical-date "$day" --output json >/dev/null
  mv "gold_$m" "gold_${m}_status" base/
done
/usr/bin/time -f "full peer %e s %M KiB" "$py" "$shared/peers/gold_deltalake.py" --silver silver --gold base/peer_gold --logical-date "$day" --full >/dev/null
"$bin" run merge.yml --output json >/dev/null
for i in $(seq "$reps"); do
  for m in window lookback touched; do
    rm -rf "gold_$m" "gold_${m}_status"
    cp -al "base/gold_$m" "gold_$m"; cp -al "base/gold_${m}_status" "gold_${m}_status"
    s=$(date +%s%N)
    /usr/bin/time -f "%M" -o rss "$bin" run "$m.yml" --logical-date "$day" --output json >"out_$m.json" 2>/dev/null
    e=$(date +%s%N)
    echo "hourly tidemark_$m rep=$i $(((e - s) / 1000000)) ms $(cat rss) KiB $(grep -o '"num_days_recomputed":[0-9]*' "out_$m.json")"
  done
  rm -rf peer_gold; cp -al base/peer_gold peer_gold
  s=$(date +%s%N)
  /usr/bin/time -f "%M" -o rss "$py" "$shared/peers/gold_deltalake.py" --silver silver --gold peer_gold --logical-date "$day" --lookback 3 >/dev/null
  e=$(date +%s%N)
  echo "hourly peer rep=$i $(((e - s) / 1000000)) ms $(cat rss) KiB"
done
