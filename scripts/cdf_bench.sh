#!/usr/bin/env bash
# The cost of the change data feed on the hourly run: the same hour merged into the same 10M
# target with and without `target.change_data_feed`, alternating, each run its own process under
# /usr/bin/time, on hard-link copies of the two base targets (Delta files are immutable). Also
# the no-op rerun of the feed target (no commit, no file written).
#
#   scripts/cdf_bench.sh BRONZE_BASE WORKDIR [REPS]
#
# BRONZE_BASE: the bench's generated bronze (scripts/bench.sh --gen-only), e.g.
# /work/bench/data/p10000000_d365/bronze_base. Environment: TIDEMARK_BIN, PY (the bench venv's
# python, for the generator's next hour), SHARED_DIR.
set -euo pipefail
base=${1:?usage: scripts/cdf_bench.sh BRONZE_BASE WORKDIR [REPS]}
work=${2:?usage: scripts/cdf_bench.sh BRONZE_BASE WORKDIR [REPS]}
reps=${3:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PY:-/work/bench/.venv/bin/python}
shared=${SHARED_DIR:-$here/../shared}
mkdir -p "$work"; work=$(cd "$work" && pwd); base=$(cd "$base" && pwd)

pipeline() { # name feed
  cat >"$work/$1.yml" <<YML
name: $1
kind: cdc_merge
source: { uri: "$work/bronze" }
target: { uri: "$work/lake/$1", change_data_feed: $2 }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "$work/lake/$1_quarantine" }
YML
}
pipeline plain false
pipeline feed true
if [ ! -e "$work/base.complete" ]; then
  rm -rf "$work/bronze" "$work/base" "$work/lake"
  cp -al "$base" "$work/bronze"
  for side in plain feed; do
    "$bin" run "$work/$side.yml" --full-reload --memory-limit 1536MiB --output json >"$work/full_$side.json"
  done
  mv "$work/lake" "$work/base"
  "$py" "$shared/peers/gen_payments.py" --increment --out "$work/bronze" >/dev/null
  touch "$work/base.complete"
fi
echo "side,rep,seconds,max_rss_kib,rows_changed,feed_version"
for i in $(seq "$reps"); do
  order="plain feed"; [ $((i % 2)) = 0 ] && order="feed plain"
  for side in $order; do
    rm -rf "$work/lake"; mkdir -p "$work/lake"
    cp -al "$work/base/$side" "$work/lake/$side"
    start=$(date +%s%N)
    /usr/bin/time -f "%M" -o "$work/rss" "$bin" run "$work/$side.yml" --output json >"$work/out.json"
    end=$(date +%s%N)
    changed=$("$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["num_inserted"]+s["num_updated"]+s["num_deleted"])' "$work/out.json")
    version=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["target_version"])' "$work/out.json")
    echo "$side,$i,$(echo "scale=3; ($end-$start)/1000000000" | bc),$(cat "$work/rss"),$changed,$version"
    if [ "$side" = feed ] && [ "$i" = 1 ]; then
      "$bin" changes "$work/feed.yml" --from-version "$version" --output json >"$work/feed_changes.json"
      "$bin" run "$work/feed.yml" --output json >"$work/rerun.json"
    fi
  done
done
