#!/usr/bin/env bash
# The hourly run in both apply modes (issue 16): copy-on-write vs deletion vectors, side by side.
#
#   scripts/apply_bench.sh [--payments N] [--days D] [--reps R] [--file-size S]
#
# What it does (release binary: TIDEMARK_BIN, default target/release/tidemark; data under
# BENCH_DIR, default /work/bench/apply):
#   gen      `tidemark generate --payments N --days D --seed 42` (kept and reused per scale)
#   base     one full reload with `target.apply: deletion_vectors` (the table takes deletion
#            vectors; a copy-on-write run on it is the plain copy-on-write run)
#   hour     `tidemark generate --next-hour` on a hard-link copy of the bronze
#   hourly   per rep, on fresh hard-link copies of the base, alternating which mode goes first:
#            the hour in each mode (`--output json`: rows written, files, marked rows), under
#            /usr/bin/time -v (wall, peak RSS), then a rerun that must commit nothing
#   check    both modes' targets read by DuckDB's delta extension (delta-kernel-rs) and by
#            the deltalake package: live rows' count and an order-free digest, equal to a full
#            reload of the same bronze
# --file-size S (e.g. 8MiB) sets `target.file_size` in both modes' pipelines; that base is its own
# full reload of the same bronze ($DATA/base_fs<S>), results in $RES = results/p<N>_d<D>_fs<S>.
# MEMORY_LIMIT (e.g. 2GiB) is passed to both full reloads as --memory-limit: without it a 30M
# reload peaks at ~14.5 GiB; 100M needs it (and ~30 GB of disk: bronze, targets, spill).
# A simulated week in both modes and how fast the results read: scripts/apply_week.sh.
# Results: $BENCH_DIR/results/p<N>_d<D>/*.json and a summary on stdout.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
P=1000000; D=365; REPS=3; FS=
while [ $# -gt 0 ]; do
  case $1 in
    --payments) P=$2; shift 2 ;;
    --days) D=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --file-size) FS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
TM=${TIDEMARK_BIN:-$REPO/target/release/tidemark}
BENCH_DIR=${BENCH_DIR:-/work/bench/apply}
DUCK_PY=${DUCK_PY:-$("$REPO/scripts/duck_venv.sh")}
DATA=$BENCH_DIR/data/p${P}_d${D}
RES=$BENCH_DIR/results/p${P}_d${D}${FS:+_fs$FS}
BASE=$DATA/base${FS:+_fs$FS}
mkdir -p "$DATA" "$RES"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

pipeline() {  # pipeline MODE -> a pipeline file for that apply mode (and --file-size)
  local f=$DATA/payments_$1${FS:+_fs$FS}.yml
  sed "s#target: { uri: \"\${var.lake}/silver/payments\" }#target: { uri: \"\${var.lake}/silver/payments\", apply: $1${FS:+, file_size: $FS} }#" \
    "$REPO/pipelines/payments.yml" > "$f"
  grep -q "apply: $1" "$f" || { echo "could not set target.apply in $f" >&2; exit 1; }
  echo "$f"
}
PCOW=$(pipeline copy_on_write)
PDV=$(pipeline deletion_vectors)

timed() {  # timed NAME CMD... : JSON stdout to $RES/NAME.json, time -v to $RES/NAME.time
  local name=$1; shift
  /usr/bin/time -v -o "$RES/$name.time" "$@" > "$RES/$name.json"
}

if [ ! -f "$DATA/bronze.complete" ]; then
  rm -rf "$DATA/base"
  log "generating $P payments over $D days"
  "$TM" generate --out "$DATA/base/bronze/payments_raw" --payments "$P" --days "$D" --seed 42 > /dev/null
  log "full reload (deletion-vector table)"
  timed base "$TM" run "$PDV" --var "lake=$DATA/base" --full-reload --output json \
    ${MEMORY_LIMIT:+--memory-limit "$MEMORY_LIMIT"}
  rm -rf "$DATA/hour"; mkdir -p "$DATA/hour/bronze"
  cp -al "$DATA/base/bronze/payments_raw" "$DATA/hour/bronze/"
  "$TM" generate --out "$DATA/hour/bronze/payments_raw" --next-hour > /dev/null
  touch "$DATA/bronze.complete"
fi
if [ -n "$FS" ] && [ ! -f "$BASE/silver.complete" ]; then
  rm -rf "$BASE"; mkdir -p "$BASE/bronze"
  cp -al "$DATA/base/bronze/payments_raw" "$BASE/bronze/"
  log "full reload with target.file_size $FS"
  timed base "$TM" run "$PDV" --var "lake=$BASE" --full-reload --output json \
    ${MEMORY_LIMIT:+--memory-limit "$MEMORY_LIMIT"}
  touch "$BASE/silver.complete"
fi

fresh() {  # fresh DIR: a lake with the hour's bronze and a copy of the base target
  rm -rf "$1"; mkdir -p "$1/bronze" "$1/silver"
  cp -al "$DATA/hour/bronze/payments_raw" "$1/bronze/"
  cp -al "$BASE/silver/payments" "$1/silver/"
}

# (results of an earlier invocation with more reps would join this one's summary)
rm -f "$RES"/cow_hour_* "$RES"/dv_hour_* "$RES"/cow_rerun_* "$RES"/dv_rerun_*
for i in $(seq 1 "$REPS"); do
  if [ $((i % 2)) = 1 ]; then order="cow dv"; else order="dv cow"; fi
  for m in $order; do
    p=$PCOW; [ "$m" = dv ] && p=$PDV
    fresh "$DATA/w_$m"
    timed "${m}_hour_$i" "$TM" run "$p" --var "lake=$DATA/w_$m" --output json
    timed "${m}_rerun_$i" "$TM" run "$p" --var "lake=$DATA/w_$m" --output json
  done
done

log "content check"
rm -rf "$DATA/truth"; mkdir -p "$DATA/truth/bronze"
cp -al "$DATA/hour/bronze/payments_raw" "$DATA/truth/bronze/"
/usr/bin/time -v -o "$RES/truth.time" "$TM" run "$PCOW" --var "lake=$DATA/truth" --full-reload \
  --output json ${MEMORY_LIMIT:+--memory-limit "$MEMORY_LIMIT"} > "$RES/truth.json"
"$DUCK_PY" "$REPO/scripts/apply_check.py" digest \
  cow="$DATA/w_cow/silver/payments" dv="$DATA/w_dv/silver/payments" truth="$DATA/truth/silver/payments" \
  > "$RES/check.json"

python3 "$REPO/scripts/apply_check.py" summary "$RES"
