#!/usr/bin/env bash
# `tidemark lateness` side by side with the DuckDB peer (../shared/peers/lateness_duckdb.py: the
# seeds' queries — now, histogram, beyond budget, completeness curve, percentiles) on the same
# bronze Delta table, alternating, each run its own process under /usr/bin/time (peak RSS).
#
#   scripts/lateness_bench.sh TABLE [REPS]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), PEER_PYTHON (an interpreter with
# deltalake==1.6.6, duckdb, pyarrow; default python3), SHARED_DIR (default ../shared),
# EVENT_TIME (default updated_at). Prints one line per run and the medians.
set -euo pipefail
table=${1:?usage: scripts/lateness_bench.sh TABLE [REPS]}
reps=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
py=${PEER_PYTHON:-python3}
shared=${SHARED_DIR:-$here/../shared}
ev=${EVENT_TIME:-updated_at}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # side rep
  local side=$1 start end
  start=$(date +%s%N)
  if [ "$side" = tidemark ]; then
    /usr/bin/time -f %M -o "$out/rss" "$bin" lateness "$table" --event-time "$ev" --output json >"$out/$side.json"
  else
    /usr/bin/time -f %M -o "$out/rss" "$py" "$shared/peers/lateness_duckdb.py" --table "$table" --event-time "$ev" >"$out/$side.json"
  fi
  end=$(date +%s%N)
  local wall_ms=$(((end - start) / 1000000)) rss_mib=$(($(tail -1 "$out/rss") / 1024))
  echo "$side rep=$2 wall_s=$(printf '%d.%03d' $((wall_ms / 1000)) $((wall_ms % 1000))) peak_rss_mib=$rss_mib"
  echo "$side $wall_ms $rss_mib" >>"$out/all"
}

for i in $(seq "$reps"); do
  run tidemark "$i"
  run duckdb "$i"
done
for side in tidemark duckdb; do
  grep "^$side " "$out/all" | sort -k2 -n | awk -v s="$side" '{w[NR]=$2; if ($3 > r) r=$3} END {m=int((NR+1)/2); printf "median %s: %.3f s wall (%d runs), largest peak RSS %d MiB\n", s, w[m]/1000, NR, r}'
done
