#!/usr/bin/env bash
# The hourly run on object storage (issue 16): the data of scripts/apply_bench.sh at one scale,
# served by the S3-compatible test server (s3s-fs) through a loopback proxy that adds DELAY_MS of
# first-byte latency to every request (scripts/latency_proxy.py), in each apply mode; wall time
# and requests per run by method (each request, in order, in $RES/<mode>_<rep>.trace).
#
#   scripts/s3_bench.sh [--payments N] [--days D] [--reps R] [--delay-ms MS] [--mbps MB]
#                       [--file-size S] [--peer]
#
# --mbps MB also paces each connection's responses to MB megabytes a second (a single S3 GET
# streams at ~50-100 MB/s; loopback makes big objects look free). --file-size S runs on the base
# that `scripts/apply_bench.sh --file-size S` made (target.file_size S in both modes).
# --peer also runs the Python peer (../shared/peers/merge_deltalake.py, deltalake 1.6.6) on the
# same bucket, from its own full reload of the base bronze ($DATA/peer_base, made once here).
#
# Environment: TIDEMARK_BIN (default target/release/tidemark), BENCH_DIR (default
# /work/bench/apply), S3S_FS (default target/tools/bin/s3s-fs, installed by scripts/test.sh).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
P=10000000; D=365; REPS=3; DELAY=20; PEER=0; MBPS=; FS=
while [ $# -gt 0 ]; do
  case $1 in
    --payments) P=$2; shift 2 ;;
    --days) D=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --delay-ms) DELAY=$2; shift 2 ;;
    --mbps) MBPS=$2; shift 2 ;;
    --file-size) FS=$2; shift 2 ;;
    --peer) PEER=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
TM=${TIDEMARK_BIN:-$REPO/target/release/tidemark}
S3S=${S3S_FS:-$REPO/target/tools/bin/s3s-fs}
BENCH_DIR=${BENCH_DIR:-/work/bench/apply}
DATA=$BENCH_DIR/data/p${P}_d${D}
RES=$BENCH_DIR/results/p${P}_d${D}${FS:+_fs$FS}/s3_${DELAY}ms${MBPS:+_${MBPS}MBps}
BASE=$DATA/base${FS:+_fs$FS}
[ -f "$DATA/bronze.complete" ] && { [ -z "$FS" ] || [ -f "$BASE/silver.complete" ]; } || {
  echo "run scripts/apply_bench.sh --payments $P --days $D${FS:+ --file-size $FS} first" >&2; exit 1; }
mkdir -p "$RES"
ROOT=$DATA/s3root
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SPORT=$(free_port)
mkdir -p "$ROOT"
"$S3S" --host 127.0.0.1 --port "$SPORT" --access-key bench --secret-key benchsecret "$ROOT" > /dev/null 2>&1 &
S3PID=$!
for _ in $(seq 1 100); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $SPORT), 1)" 2>/dev/null && break
  sleep 0.1
done
trap 'kill $S3PID 2>/dev/null || true; [ -n "${PXPID:-}" ] && kill $PXPID 2>/dev/null || true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true

PY=${PEER_PYTHON:-/work/bench/.venv/bin/python}
PEER_SCRIPT=$REPO/../shared/peers/merge_deltalake.py
MODES="cow dv"
if [ "$PEER" = 1 ]; then
  MODES="cow dv peer"
  [ -d "$DATA/peer_base/_delta_log" ] || "$PY" "$PEER_SCRIPT" --full-reload \
    --bronze "$DATA/base/bronze/payments_raw" --target "$DATA/peer_base" > /dev/null
fi
for i in $(seq 1 "$REPS"); do
  for m in $MODES; do
    p=$DATA/payments_copy_on_write${FS:+_fs$FS}.yml
    [ "$m" = dv ] && p=$DATA/payments_deletion_vectors${FS:+_fs$FS}.yml
    # a fresh bucket: the hour's bronze and the base target, hard-linked (s3s-fs serves files)
    rm -rf "$ROOT"; mkdir -p "$ROOT/lake/bronze" "$ROOT/lake/silver"
    cp -al "$DATA/hour/bronze/payments_raw" "$ROOT/lake/bronze/"
    cp -al "$BASE/silver/payments" "$ROOT/lake/silver/"
    [ "$m" = peer ] && cp -al "$DATA/peer_base" "$ROOT/lake/peer"
    PPORT=$(free_port)
    MBPS=${MBPS:-0} python3 "$REPO/scripts/latency_proxy.py" "$PPORT" "$SPORT" "$DELAY" "$RES/${m}_$i.requests.json" "$RES/${m}_$i.trace" &
    PXPID=$!
    for _ in $(seq 1 50); do
      python3 -c "import socket; socket.create_connection(('127.0.0.1', $PPORT), 1)" 2>/dev/null && break
      sleep 0.1
    done
    if [ "$m" = peer ]; then
      # (delta-rs' Python writer commits to S3 only with a lock or this flag; one writer here)
      AWS_ENDPOINT_URL=http://127.0.0.1:$PPORT AWS_S3_ALLOW_UNSAFE_RENAME=true \
        /usr/bin/time -f "%e %M" -o "$RES/${m}_$i.time" "$PY" "$PEER_SCRIPT" \
        --bronze s3://lake/bronze/payments_raw --target s3://lake/peer > "$RES/${m}_$i.log" 2>&1
      kill -TERM $PXPID; wait $PXPID 2>/dev/null || true; PXPID=
      echo "$m rep $i: $(cat "$RES/${m}_$i.time") requests $(cat "$RES/${m}_$i.requests.json")"
      continue
    fi
    AWS_ENDPOINT_URL=http://127.0.0.1:$PPORT /usr/bin/time -f "%e %M" -o "$RES/${m}_$i.time" \
      "$TM" run "$p" --var lake=s3://lake --output json > "$RES/${m}_$i.json"
    kill -TERM $PXPID; wait $PXPID 2>/dev/null || true; PXPID=
    echo "$m rep $i: $(cat "$RES/${m}_$i.time") requests $(cat "$RES/${m}_$i.requests.json") phases $(python3 -c "import json,sys; print(json.load(open('$RES/${m}_$i.json'))['phases_ms'])")"
  done
done
