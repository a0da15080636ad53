#!/usr/bin/env bash
# tidemark vs the Python peer (deltalake 1.6.6), same data, same run — issue 5's table.
#
#   scripts/bench.sh [--payments N] [--days D] [--reps R] [--series [HOURS]] [--series-only]
#                    [--no-duckdb] [--regen] [--gen-only] [--no-report]
#   scripts/bench.sh --apply-scales N[,N...] [--reps R]
#
#   scripts/bench.sh                                        # quick: 200k payments / 30 days
#   scripts/bench.sh --payments 1000000 --days 90 --series  # 1M + a week of hourly runs
#   scripts/bench.sh --payments 5000000 --days 365
#   scripts/bench.sh --payments 10000000 --days 365
#   scripts/bench.sh --apply-scales 30000000,100000000      # the hour in both apply modes at scale
#
# --apply-scales runs scripts/apply_bench.sh at each scale (tidemark's own generator, 365 days,
# both `target.apply` modes, full reloads under MEMORY_LIMIT, default 2GiB) and prints, per scale
# and mode, rows written per changed key, files touched, ms per changed key and seconds. The
# Python peer is not run there: its full reload of 10M payments already needs 9.1 GiB, so it does
# not fit this kind of machine at 30M or 100M. 100M needs ~30 GB of disk and ~45 minutes.
#
# What it does (each step under /usr/bin/time -v; wall time measured around it in ns):
#   setup     Python venv for the peer (deltalake==1.6.6 pyarrow duckdb numpy) unless PEER_PYTHON
#             is given; tidemark release binary (cargo build --release) unless TIDEMARK_BIN is given
#   gen       bronze with the peer's generator ($SHARED_DIR/peers/gen_payments.py, seed 42,
#             +13 h so the next hour is a busy one). Kept and reused across runs (--regen to redo).
#   full      full reload, alternating: peer default / tidemark --full-reload / DuckDB reference
#   gen_inc   append the next hour of arrivals (on a hard-link copy of the base bronze)
#   truth     peer full reload of bronze-after-increment = the ground truth
#   hourly    per rep, on fresh copies of the base targets, rotating the order:
#             peer default (streamed_exec=True, default file size), peer tuned
#             (streamed_exec=False, 8 MiB files), tidemark — each followed by a rerun (no-op)
#   layout    which keys the hour changed, how old they are, and how many files / unchanged rows a
#             copy-on-write merge must rewrite for key-sorted targets of 1..8192 files
#   watermark tidemark's watermark read alone: delta-rs log stats of its target (bench_tools.py) and
#             uprobes on its lake::max_from_stats inside a real run (scripts/profile.sh --tool watermark)
#   check     tidemark's live rows (not _deleted) digest == truth digest (verify.py digest), and
#             verify.py diff of each incremental target against the truth
#   series    (--series) HOURS consecutive hours (default 168) on the same scale: generate the
#             hour, run peer default, peer tuned, tidemark; `tidemark maintain` every 24 h; final
#             content check against a full reload
#   report    scripts/bench_report.py rewrites the generated part of BENCHMARKS.md from every
#             scale found under $BENCH_DIR/results/
#
# Environment: BENCH_DIR (default /work/bench: data/, results/, .venv/), SHARED_DIR (default
# <repo>/../shared), TIDEMARK_BIN, PEER_PYTHON, TIDEMARK_PIPELINE (default
# <repo>/pipelines/payments.yml), TM_FULL_ARGS (extra arguments for tidemark's full reload, e.g. a
# memory limit once it exists), STEP_TIMEOUT (s, default 1800), CARGO_TARGET_DIR (release build),
# KEEP_SERIES=1 (keep the series' tables; they grow by every file rewritten in the week).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SCRIPTS=$REPO/scripts
P=200000; D=30; REPS=3; SERIES=0; SERIES_ONLY=0; DUCK=1; REGEN=0; REPORT=1; GEN_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --payments) P=$2; shift 2 ;;
    --days) D=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --series)
      if [ $# -gt 1 ] && [[ $2 =~ ^[0-9]+$ ]]; then SERIES=$2; shift 2; else SERIES=168; shift; fi ;;
    --series-only) SERIES_ONLY=1; [ "$SERIES" = 0 ] && SERIES=168; shift ;;
    --no-duckdb) DUCK=0; shift ;;
    --regen) REGEN=1; shift ;;
    --gen-only) GEN_ONLY=1; shift ;;
    --no-report) REPORT=0; shift ;;
    --apply-scales) APPLY_SCALES=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
[ "$REPS" -ge 1 ] || { echo "--reps must be >= 1" >&2; exit 64; }

if [ -n "${APPLY_SCALES:-}" ]; then
  for n in ${APPLY_SCALES//,/ }; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "--apply-scales takes payment counts, like 30000000,100000000" >&2; exit 64; }
    echo "== $n payments: scripts/apply_bench.sh --payments $n --reps $REPS" >&2
    APPLY_DIR=${BENCH_DIR:-/work/bench}/apply
    BENCH_DIR=$APPLY_DIR MEMORY_LIMIT=${MEMORY_LIMIT:-2GiB} "$REPO/scripts/apply_bench.sh" --payments "$n" --days 365 \
      --reps "$REPS" | python3 -c '
import json, sys
d = json.load(sys.stdin)
for m, name in (("cow", "copy-on-write"), ("dv", "deletion vectors")):
    x = d[m]
    print("%s payments, %s: %d changed keys, %d/%d files touched, %.1f rows written per changed key, "
          "%.3f ms per changed key, median %s s (runs %s), peak RSS %.0f MiB" % (
              sys.argv[1], name, x["changed_keys"], x["files_rewritten_or_marked"],
              x["files_candidate"], x["rows_written_per_changed_key"], x["ms_per_changed_key"],
              x["median_wall_s"], x["walls"], x["max_rss_mib"]))
' "$n"
    python3 -c 'import json, sys; print("%s payments: both modes and a full reload have the same content: %s" % (sys.argv[1], json.load(open(sys.argv[2]))["all_equal"]))' \
      "$n" "$APPLY_DIR/results/p${n}_d365/check.json"
  done
  exit 0
fi

BENCH_DIR=${BENCH_DIR:-/work/bench}
SHARED_DIR=${SHARED_DIR:-$REPO/../shared}
PEERS=$(cd "$SHARED_DIR/peers" && pwd)
PIPELINE=${TIDEMARK_PIPELINE:-$REPO/pipelines/payments.yml}
STEP_TIMEOUT=${STEP_TIMEOUT:-1800}
TM_FULL_ARGS=${TM_FULL_ARGS:-}
TAG=p${P}_d${D}
DATA=$BENCH_DIR/data/$TAG
RES=$BENCH_DIR/results/$TAG
W=$DATA/work
mkdir -p "$BENCH_DIR" "$DATA" "$RES"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$RES/steps.log" >&2; }

# ---------------------------------------------------------------- setup
if [ -z "${PEER_PYTHON:-}" ]; then
  if ! "$BENCH_DIR/.venv/bin/python" -c 'import deltalake, duckdb, pyarrow, numpy' 2>/dev/null; then
    log "setting up the peer's venv in $BENCH_DIR/.venv"
    python3 -m venv "$BENCH_DIR/.venv"
    "$BENCH_DIR/.venv/bin/pip" install -q deltalake==1.6.6 pyarrow duckdb numpy
  fi
  PEER_PYTHON=$BENCH_DIR/.venv/bin/python
fi
PY=$PEER_PYTHON
if [ "$GEN_ONLY" = 1 ]; then
  TIDEMARK_BIN=/bin/true
elif [ -z "${TIDEMARK_BIN:-}" ]; then
  log "building tidemark (cargo build --release; CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target})"
  (cd "$REPO" && cargo build --release --quiet)
  TIDEMARK_BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/tidemark
fi
TM=$TIDEMARK_BIN
[ -x "$TM" ] || { echo "no tidemark binary at $TM" >&2; exit 66; }

# Facts about this run, for the report.
TM_HELP=$("$TM" run --help 2>&1 || true)
if [ -z "$TM_FULL_ARGS" ] && grep -q -- '--memory-limit' <<<"$TM_HELP"; then
  TM_FULL_ARGS="--memory-limit 1536MiB"   # issue 5: full reload with a 1.5 GiB limit
fi
"$PY" - "$RES/meta.json" <<EOF
import json, os, platform, subprocess, sys, time
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception: return None
json.dump({
  "payments": $P, "days": $D, "reps": $REPS, "series_hours": $SERIES,
  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  "tidemark_bin": "$TM", "tidemark_version": sh("'$TM' --version"),
  "tidemark_commit": sh("git -C '$REPO' rev-parse --short HEAD") ,
  "tidemark_dirty": bool(sh("git -C '$REPO' status --porcelain -- src Cargo.toml Cargo.lock")),
  "tidemark_binary_mtime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime("$TM"))),
  "tm_full_args": "$TM_FULL_ARGS", "pipeline": "$PIPELINE",
  "peer_python": "$PY", "peer_versions": sh("'$PY' -c 'import deltalake,duckdb,pyarrow;print(deltalake.__version__,duckdb.__version__,pyarrow.__version__)'"),
  "cpus": os.cpu_count(), "mem_gib": round(os.sysconf("SC_PAGE_SIZE")*os.sysconf("SC_PHYS_PAGES")/2**30, 1),
  "kernel": platform.release(), "loadavg_start": os.getloadavg(),
}, open(sys.argv[1], "w"), indent=1)
EOF

# ---------------------------------------------------------------- helpers
# step NAME cmd...  -> RES/NAME.{json,err,time,wall,rc,load}; returns the command's exit code.
step() {
  local name=$1; shift
  log "$name: $*"
  cut -d' ' -f1 /proc/loadavg > "$RES/$name.load"
  local t0 t1 rc=0
  t0=$(date +%s%N)
  timeout "$STEP_TIMEOUT" /usr/bin/time -v -o "$RES/$name.time" "$@" >"$RES/$name.json" 2>"$RES/$name.err" || rc=$?
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000 ))" > "$RES/$name.wall"   # microseconds
  echo "$rc" > "$RES/$name.rc"
  if [ "$rc" != 0 ]; then
    log "$name FAILED (exit $rc); last lines of $RES/$name.err:"
    tail -5 "$RES/$name.err" | tee -a "$RES/steps.log" >&2
  else
    log "$name done in $(( (t1 - t0) / 1000000 )) ms"
  fi
  return "$rc"
}
must() { step "$@" || { log "cannot go on without $1"; exit 1; }; }
# A lake folder for tidemark's pipeline: bronze/payments_raw -> a bronze table, silver/ empty.
lake_for() {  # lake_for DIR BRONZE_TABLE
  rm -rf "$1"; mkdir -p "$1/bronze" "$1/silver"
  ln -s "$2" "$1/bronze/payments_raw"
}
# (commands, not functions: they run under /usr/bin/time)
PEER=("$PY" "$PEERS/merge_deltalake.py")
TMRUN=("$TM" run "$PIPELINE" --output json --var)  # + lake=DIR
# check NAME TIDEMARK_TARGET TRUTH : live-row digest + per-key diff (never fails the script)
check() {
  step "check_$1" "$PY" "$SCRIPTS/bench_tools.py" check --peers "$PEERS" \
    --tidemark "$2" --truth "$3" --work "$W/check_$1.parquet" || true
}
peer_diff() {  # peer_diff NAME PEER_TARGET TRUTH
  step "diff_$1" "$PY" "$PEERS/verify.py" diff "$2" "$3" || true
}

# ---------------------------------------------------------------- data
BASE=$DATA/bronze_base
if [ "$REGEN" = 1 ] || [ ! -f "$DATA/bronze_base.complete" ]; then
  rm -rf "$BASE" "$DATA/bronze_base.complete"
  must gen "$PY" "$PEERS/gen_payments.py" --payments "$P" --days "$D" --extra-hours 13 --seed 42 --out "$BASE"
  cp "$RES/gen.json" "$DATA/gen.json"
  touch "$DATA/bronze_base.complete"
else
  log "reusing $BASE (generated earlier; --regen to redo)"
  cp "$DATA/gen.json" "$RES/gen.json"
fi
mkdir -p "$W"
[ "$GEN_ONLY" = 1 ] && { log "data ready in $DATA"; exit 0; }
# results of an earlier run at this scale would mix with this one's
if [ "$SERIES_ONLY" = 0 ]; then
  find "$RES" -maxdepth 1 -type f ! -name 'gen.*' ! -name meta.json ! -name steps.log -delete
fi

# ---------------------------------------------------------------- main measurements
if [ "$SERIES_ONLY" = 0 ]; then
  # full reloads of the base bronze, alternating
  for i in $(seq 1 "$REPS"); do
    rm -rf "$W/peer_full"
    step "peer_full_$i" "${PEER[@]}" --full-reload --bronze "$BASE" --target "$W/peer_full" || true
    lake_for "$W/tm_full" "$BASE"
    # shellcheck disable=SC2086
    step "tm_full_$i" "${TMRUN[@]}" "lake=$W/tm_full" --full-reload $TM_FULL_ARGS || true
    if [ "$DUCK" = 1 ]; then
      step "duck_full_$i" "$PY" "$PEERS/duckdb_compute.py" --full --bronze "$BASE" \
        --write-out "$W/duck_full.parquet" || true
      rm -f "$W/duck_full.parquet"
    fi
  done
  [ -d "$W/peer_full/_delta_log" ] && [ -d "$W/tm_full/silver/payments/_delta_log" ] \
    || { log "full reloads failed; cannot build the base targets"; exit 1; }
  rm -rf "$DATA/peer_default_base" "$DATA/tm_base"
  mv "$W/peer_full" "$DATA/peer_default_base"
  mv "$W/tm_full/silver/payments" "$DATA/tm_base"
  rm -rf "$W/tm_full"
  rm -rf "$DATA/peer_tuned_base"
  must peer_full_tuned "${PEER[@]}" --full-reload --target-file-size 8388608 --bronze "$BASE" --target "$DATA/peer_tuned_base"
  check base "$DATA/tm_base" "$DATA/peer_default_base"

  # the next hour, on a hard-link copy (Delta files are immutable; appends add new files)
  rm -rf "$DATA/bronze"
  cp -al "$BASE" "$DATA/bronze"
  must gen_inc "$PY" "$PEERS/gen_payments.py" --increment --out "$DATA/bronze"
  rm -rf "$DATA/truth"
  must truth "${PEER[@]}" --full-reload --bronze "$DATA/bronze" --target "$DATA/truth"
  lake_for "$W/tm_truth" "$DATA/bronze"
  # shellcheck disable=SC2086
  step tm_truth "${TMRUN[@]}" "lake=$W/tm_truth" --full-reload $TM_FULL_ARGS || true
  check tm_full_after_inc "$W/tm_truth/silver/payments" "$DATA/truth"
  rm -rf "$W/tm_truth"

  run_peer_default() {
    rm -rf "$W/peer_default"; cp -r "$DATA/peer_default_base" "$W/peer_default"
    step "peer_inc_$1" "${PEER[@]}" --bronze "$DATA/bronze" --target "$W/peer_default" || true
    step "peer_rerun_$1" "${PEER[@]}" --bronze "$DATA/bronze" --target "$W/peer_default" || true
  }
  run_peer_tuned() {
    rm -rf "$W/peer_tuned"; cp -r "$DATA/peer_tuned_base" "$W/peer_tuned"
    step "tuned_inc_$1" "${PEER[@]}" --no-streamed-exec --bronze "$DATA/bronze" --target "$W/peer_tuned" || true
    step "tuned_rerun_$1" "${PEER[@]}" --no-streamed-exec --bronze "$DATA/bronze" --target "$W/peer_tuned" || true
  }
  run_tm() {
    lake_for "$W/tm" "$DATA/bronze"; cp -r "$DATA/tm_base" "$W/tm/silver/payments"
    step "tm_inc_$1" "${TMRUN[@]}" "lake=$W/tm" || true
    [ "$1" = 1 ] && cp -r "$W/tm/silver/payments" "$W/tm_after_inc_1"
    step "tm_rerun_$1" "${TMRUN[@]}" "lake=$W/tm" || true
  }
  for i in $(seq 1 "$REPS"); do
    case $(( (i - 1) % 3 )) in
      0) run_peer_default "$i"; run_peer_tuned "$i"; run_tm "$i" ;;
      1) run_tm "$i"; run_peer_default "$i"; run_peer_tuned "$i" ;;
      2) run_peer_tuned "$i"; run_tm "$i"; run_peer_default "$i" ;;
    esac
  done
  check tm_inc "$W/tm_after_inc_1" "$DATA/truth"
  check tm_rerun "$W/tm/silver/payments" "$DATA/truth"
  peer_diff peer_inc "$W/peer_default" "$DATA/truth"
  peer_diff tuned_inc "$W/peer_tuned" "$DATA/truth"
  rm -rf "$W/tm_after_inc_1"

  # what copy-on-write has to rewrite for this hour, for key-sorted layouts of 1..8192 files
  step layout "$PY" "$SCRIPTS/bench_tools.py" layout --before "$DATA/peer_default_base" --after "$DATA/truth" || true

  # the watermark on its own: delta-rs log statistics of tidemark's target (what
  # lake::max_from_stats reads) vs the naive scan, timed in one process after opening the table
  step watermark "$PY" "$SCRIPTS/bench_tools.py" watermark --reps 15 \
    --table tm="$W/tm/silver/payments" --table peer_default="$W/peer_default" \
    --table peer_tuned="$W/peer_tuned" || true
  # ... and inside tidemark's real run: uprobes on lake::max_from_stats (needs perf + uprobes)
  if command -v perf >/dev/null 2>&1; then
    for i in $(seq 1 "$REPS"); do
      step "tm_wmprobe_$i" env TIDEMARK_BIN="$TM" BENCH_DIR="$BENCH_DIR" TIDEMARK_PIPELINE="$PIPELINE" \
        "$SCRIPTS/profile.sh" --payments "$P" --days "$D" --tool watermark --what inc || true
    done
  fi
  du -sb "$DATA/bronze" "$DATA/peer_default_base" "$DATA/peer_tuned_base" "$DATA/tm_base" \
    > "$RES/sizes.txt" 2>/dev/null || true
fi

# ---------------------------------------------------------------- a week of hourly runs
if [ "$SERIES" -gt 0 ]; then
  S=$DATA/series
  rm -rf "$S" "$RES/series"; mkdir -p "$S" "$RES/series"
  [ -d "$DATA/peer_default_base" ] && [ -d "$DATA/tm_base" ] && [ -d "$DATA/peer_tuned_base" ] \
    || { log "--series needs the base targets: run once without --series-only"; exit 1; }
  cp -al "$BASE" "$S/bronze"
  cp -r "$DATA/peer_default_base" "$S/peer_default"
  cp -r "$DATA/peer_tuned_base" "$S/peer_tuned"
  lake_for "$S/lake" "$S/bronze"; cp -r "$DATA/tm_base" "$S/lake/silver/payments"
  RES_MAIN=$RES; RES=$RES/series
  for h in $(seq 1 "$SERIES"); do
    must "gen_$h" "$PY" "$PEERS/gen_payments.py" --increment --out "$S/bronze"
    case $(( h % 3 )) in
      0) ORDER="tm peer tuned" ;; 1) ORDER="peer tuned tm" ;; *) ORDER="tuned tm peer" ;;
    esac
    for who in $ORDER; do
      case $who in
        peer) step "peer_$h" "${PEER[@]}" --bronze "$S/bronze" --target "$S/peer_default" || true ;;
        tuned) step "tuned_$h" "${PEER[@]}" --no-streamed-exec --bronze "$S/bronze" --target "$S/peer_tuned" || true ;;
        tm) step "tm_$h" "${TMRUN[@]}" "lake=$S/lake" || true ;;
      esac
    done
    if [ $(( h % 24 )) = 0 ]; then
      step "maintain_$h" "$TM" maintain "$PIPELINE" --var "lake=$S/lake" --output json || true
    fi
  done
  must truth "${PEER[@]}" --full-reload --bronze "$S/bronze" --target "$S/truth"
  W_SAVE=$W; W=$S
  check series "$S/lake/silver/payments" "$S/truth"
  peer_diff peer "$S/peer_default" "$S/truth"
  peer_diff tuned "$S/peer_tuned" "$S/truth"
  W=$W_SAVE
  du -sb "$S/bronze" "$S/peer_default" "$S/peer_tuned" "$S/lake/silver/payments" > "$RES/sizes.txt" 2>/dev/null || true
  RES=$RES_MAIN
  # copy-on-write leaves every rewritten file behind until vacuum may delete it (7 days): at 1M
  # the three targets take ~18 GB after 168 hours; keep them only when asked
  [ "${KEEP_SERIES:-0}" = 1 ] || rm -rf "$S"
fi

log "all steps done"
if [ "$REPORT" = 1 ]; then
  "$PY" "$SCRIPTS/bench_report.py" --results "$BENCH_DIR/results" --out "$REPO/BENCHMARKS.md"
  log "wrote $REPO/BENCHMARKS.md"
fi
