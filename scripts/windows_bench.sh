#!/usr/bin/env bash
# Gold by tumbling window (kind: aggregate with `window:`) against a Python peer (DuckDB's
# time_bucket + the deltalake package's predicate overwrite: scripts/windows_peer.py), on the same
# silver, side by side (farm-bench --vs: medians and pair-by-pair ratios):
#   full     every window of every day (tidemark --full-reload vs the peer's --full)
#   hourly   silver gets the next hour, then on fresh hard-link copies of gold built before it:
#            tidemark's run (lookback 3d: the 4 open days' windows restated) vs the peer's 4 days
# plus the same tidemark runs without `window:` (rows per day), for what the windows cost.
#
#   scripts/windows_bench.sh WORK [PAYMENTS] [WINDOW_MINUTES] [RUNS]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), PY (a python with deltalake and
# duckdb; default /work/bench/.venv/bin/python).
set -euo pipefail
work=${1:?usage: scripts/windows_bench.sh WORK [PAYMENTS] [WINDOW_MINUTES] [RUNS]}
payments=${2:-1000000}
minutes=${3:-5}
runs=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PY:-/work/bench/.venv/bin/python}
mkdir -p "$work"; work=$(cd "$work" && pwd)
export TIDEMARK_FAKE_NOW=2024-01-31T12:00:00Z
day=2024-01-31
gold() { # name window-line
  cat >"$work/$1.yml" <<YML
name: $1
kind: aggregate
source: { uri: "$work/silver" }
target: { uri: "$work/gold_$1" }
event_date: { column: created_at, time_zone: UTC }
$2
group_by: [currency]
measures:
  - { name: payments, agg: count }
  - { name: amount_cents, agg: sum, column: amount_cents }
recompute: { lookback: 3d, max_lookback: 3d }
YML
}
gold windowed "window: ${minutes}m"
gold daily ""
cat >"$work/merge.yml" <<YML
name: payments
kind: cdc_merge
source: { uri: "$work/bronze" }
target: { uri: "$work/silver" }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "$work/quarantine" }
YML
if [ ! -d "$work/silver" ]; then
  "$bin" generate --out "$work/bronze" --payments "$payments" --days 30 >/dev/null
  "$bin" run "$work/merge.yml" >/dev/null
fi
echo "== full: every window (tidemark --full-reload) vs the peer's --full"
farm-bench -n "$runs" --timeout 1800 --vs "$py $here/scripts/windows_peer.py --silver $work/silver --gold $work/peer_full --logical-date $day --window $minutes --full" \
  -- "$bin" run "$work/windowed.yml" --full-reload --logical-date "$day"
echo "== full: rows per day (no window:) vs per ${minutes}m window"
farm-bench -n "$runs" --timeout 1800 --vs "$bin run $work/windowed.yml --full-reload --logical-date $day" \
  -- "$bin" run "$work/daily.yml" --full-reload --logical-date "$day"
# the hour: gold as it was before the next hour, copied fresh for every run
"$bin" run "$work/windowed.yml" --full-reload --logical-date "$day" >/dev/null
"$bin" run "$work/daily.yml" --full-reload --logical-date "$day" >/dev/null
"$py" "$here/scripts/windows_peer.py" --silver "$work/silver" --gold "$work/peer_base" --logical-date "$day" --window "$minutes" --full >/dev/null
for t in windowed daily windowed_status windowed_adjustments daily_status daily_adjustments; do
  [ -d "$work/gold_$t" ] && rm -rf "$work/base_$t" && cp -al "$work/gold_$t" "$work/base_$t"
done
"$bin" generate --out "$work/bronze" --next-hour >/dev/null
"$bin" run "$work/merge.yml" >/dev/null
fresh() { # the tidemark gold named $1, restored to before the hour
  echo "rm -rf $work/gold_$1 $work/gold_$1_status && cp -al $work/base_$1 $work/gold_$1 && cp -al $work/base_$1_status $work/gold_$1_status"
}
echo "== the hour: the 4 open days' ${minutes}m windows restated (tidemark) vs the peer's 4 days"
farm-bench -n "$runs" --timeout 1800 --vs "sh -c 'rm -rf $work/peer_hour && cp -al $work/peer_base $work/peer_hour && exec $py $here/scripts/windows_peer.py --silver $work/silver --gold $work/peer_hour --logical-date $day --window $minutes'" \
  -- sh -c "$(fresh windowed) && exec $bin run $work/windowed.yml --logical-date $day"
echo "== the hour: rows per day vs per ${minutes}m window (tidemark)"
farm-bench -n "$runs" --timeout 1800 --vs "sh -c '$(fresh windowed) && exec $bin run $work/windowed.yml --logical-date $day'" \
  -- sh -c "$(fresh daily) && exec $bin run $work/daily.yml --logical-date $day"
echo "== content: tidemark's windows equal the peer's (after the hour)"
"$py" - "$work" <<'PY'
import sys, duckdb
from deltalake import DeltaTable
w = sys.argv[1]
con = duckdb.connect(); con.execute("SET TimeZone = 'UTC'")
con.register("t", DeltaTable(f"{w}/gold_windowed").to_pyarrow_dataset())
con.register("p", DeltaTable(f"{w}/peer_hour").to_pyarrow_dataset())
q = "SELECT window_start, window_end, currency, payments, amount_cents FROM {}"
a = con.sql(f"SELECT count(*) FROM ({q.format('t')} EXCEPT ALL {q.format('p')})").fetchall()[0][0]
b = con.sql(f"SELECT count(*) FROM ({q.format('p')} EXCEPT ALL {q.format('t')})").fetchall()[0][0]
n = con.sql("SELECT count(*) FROM t").fetchall()[0][0]
print(f"tidemark rows {n}; only in tidemark {a}, only in the peer {b}")
PY
