#!/usr/bin/env bash
# An hourly SCD2 dimension run against the deltalake peer (scripts/dimension_peer.py: the SCD2
# MERGE as its users write it, two statements), on the same merchants feed, side by side:
# N merchants (default 1M) already in the dimension, then one hour of K changes (default 2,083:
# 5% of the merchants a day), 30% of them to a tracked column. Per rep, on fresh hard-link copies
# of both dimensions built before the hour, alternating which goes first.
#
#   scripts/dimension_bench.sh WORKDIR [REPS] [MERCHANTS] [CHANGES]
#
# Environment: TIDEMARK_BIN, PY (a python with deltalake and pyarrow), APPLY (the dimension's
# target.apply: copy_on_write, the default, or deletion_vectors; each mode has its own base).
set -euo pipefail
work=${1:?usage: scripts/dimension_bench.sh WORKDIR [REPS] [MERCHANTS] [CHANGES]}
reps=${2:-5}
merchants=${3:-1000000}
changes=${4:-2083}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PY:-/work/bench/.venv/bin/python}
peer="$here/scripts/dimension_peer.py"
apply=${APPLY:-copy_on_write}
base=base; [ "$apply" = copy_on_write ] || base=base_$apply
mkdir -p "$work"; work=$(cd "$work" && pwd)
cd "$work"
if [ ! -d bronze ]; then
  "$py" "$peer" gen bronze --merchants "$merchants" --changes "$changes"
fi
pipeline() { # source target
  cat <<YML
name: merchants
kind: dimension
source: { uri: "$1" }
target: { uri: "$2", apply: $apply }
keys: [merchant_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
deletes: { column: op, values: [D] }
columns: { exclude: [op] }
track_history: [segment, country]
quarantine: { uri: "$work/quarantine" }
YML
}
if [ ! -d "$base" ]; then
  # The dimensions before the hour: bronze as of version 0 (a copy without the hour's commit).
  rm -rf bronze_v0 && cp -al bronze bronze_v0 && rm bronze_v0/_delta_log/00000000000000000001.json
  mkdir -p "$base"
  pipeline "$work/bronze_v0" "$work/$base/tidemark" > base.yml
  /usr/bin/time -f "tidemark bootstrap: %e s, %M KiB" "$bin" run base.yml --output json > "$base/bootstrap.json"
  "$py" "$peer" bootstrap bronze "$base/peer"
fi
for i in $(seq 1 "$reps"); do
  rm -rf rep && mkdir rep && cp -al "$base/tidemark" rep/tidemark && cp -al "$base/peer" rep/peer
  pipeline "$work/bronze" "$work/rep/tidemark" > hour.yml
  t() { /usr/bin/time -f "%e %M" "$bin" run hour.yml --output json 2> rep/tm.time > rep/tm.json; }
  p() { /usr/bin/time -f "%e %M" "$py" "$peer" hourly bronze rep/peer 2> rep/peer.time > /dev/null; }
  if [ $((i % 2)) -eq 1 ]; then t; p; else p; t; fi
  "$py" - <<PY
import json
s = json.load(open("rep/tm.json"))
tm = open("rep/tm.time").read().split()
pe = open("rep/peer.time").read().split()
print(f"rep $i: tidemark {float(tm[-2]):.3f} s ({int(tm[-1])//1024} MiB; keys {s['num_keys_read']} read, "
      f"{s['num_keys_changed']} changed, rows {s['num_rows_before']} -> {s['num_rows_after']}; "
      f"files +{s['num_files_added']}/-{s['num_files_removed']}, {s.get('num_files_marked', 0)} marked, "
      f"{s.get('num_rows_marked_deleted', 0)} rows marked; phases {s['phases_ms']}) | "
      f"peer {float(pe[-2]):.3f} s ({int(pe[-1])//1024} MiB)")
PY
done
