#!/usr/bin/env bash
# A simulated week in both apply modes, then how fast the two targets read (issue 16: "reads stay
# fast"): on the base of scripts/apply_bench.sh at one scale, HOURS hourly runs (default 168) in
# each mode over the same bronze, `tidemark maintain` every 24 hours, then DuckDB's delta
# extension counts and looks one payment up on both (median of 5 each), and reads both whole
# (digest: they must be equal).
#
#   scripts/apply_week.sh [--payments N] [--days D] [--hours H]
#
# Environment: TIDEMARK_BIN, BENCH_DIR (default /work/bench/apply), DUCK_PY.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
P=1000000; D=365; HOURS=168
while [ $# -gt 0 ]; do
  case $1 in
    --payments) P=$2; shift 2 ;;
    --days) D=$2; shift 2 ;;
    --hours) HOURS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
TM=${TIDEMARK_BIN:-$REPO/target/release/tidemark}
BENCH_DIR=${BENCH_DIR:-/work/bench/apply}
DUCK_PY=${DUCK_PY:-$("$REPO/scripts/duck_venv.sh")}
DATA=$BENCH_DIR/data/p${P}_d${D}
RES=$BENCH_DIR/results/p${P}_d${D}/week
[ -f "$DATA/bronze.complete" ] || { echo "run scripts/apply_bench.sh --payments $P --days $D first" >&2; exit 1; }
rm -rf "$RES"; mkdir -p "$RES"
W=$DATA/week
rm -rf "$W"; mkdir -p "$W/bronze" "$W/cow/silver" "$W/dv/silver"
cp -al "$DATA/base/bronze/payments_raw" "$W/bronze/"
# both lakes read the same bronze
ln -s "$W/bronze" "$W/cow/bronze"
ln -s "$W/bronze" "$W/dv/bronze"
cp -al "$DATA/base/silver/payments" "$W/cow/silver/"
cp -al "$DATA/base/silver/payments" "$W/dv/silver/"
for h in $(seq 1 "$HOURS"); do
  "$TM" generate --out "$W/bronze/payments_raw" --next-hour > /dev/null
  for m in cow dv; do
    p=$DATA/payments_copy_on_write.yml; [ "$m" = dv ] && p=$DATA/payments_deletion_vectors.yml
    /usr/bin/time -f "%e %M" -o "$RES/${m}_$h.time" "$TM" run "$p" --var "lake=$W/$m" --output json > "$RES/${m}_$h.json"
    if [ $((h % 24)) = 0 ]; then
      "$TM" maintain "$p" --var "lake=$W/$m" --output json > "$RES/${m}_maintain_$h.json"
    fi
  done
done
"$DUCK_PY" "$REPO/scripts/apply_check.py" reads cow="$W/cow/silver/payments" dv="$W/dv/silver/payments" > "$RES/reads.json"
"$DUCK_PY" "$REPO/scripts/apply_check.py" digest cow="$W/cow/silver/payments" dv="$W/dv/silver/payments" > "$RES/digest.json"
python3 - "$RES" "$HOURS" <<'PY'
import json, statistics, sys, glob, os
res, hours = sys.argv[1], int(sys.argv[2])
out = {}
for m in ("cow", "dv"):
    walls, written, changed = [], 0, 0
    for h in range(1, hours + 1):
        walls.append(float(open(f"{res}/{m}_{h}.time").read().split()[0]))
        s = json.load(open(f"{res}/{m}_{h}.json"))
        written += s["num_rows_written"]
        changed += s["num_inserted"] + s["num_updated"] + s["num_deleted"]
    out[m] = {"median_hour_s": statistics.median(walls), "total_s": sum(walls),
              "rows_written": written, "changed_keys": changed,
              "rows_written_per_changed_key": written / max(changed, 1)}
out["reads"] = json.load(open(f"{res}/reads.json"))
out["digest_equal"] = json.load(open(f"{res}/digest.json"))["all_equal"]
print(json.dumps(out, indent=1))
PY
