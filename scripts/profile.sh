#!/usr/bin/env bash
# Profile tidemark's hourly run (and its rerun) on data that scripts/bench.sh left behind.
#
#   scripts/profile.sh --payments N --days D [--tool perf|callgrind|watermark] [--what inc|rerun|full]
#
# perf:      `perf record -e cpu-clock --call-graph dwarf` (a software clock: this VM has no
#            hardware counters, `perf stat -e instructions` is <not supported>); sampled wall
#            profile of the release binary; report by self time and by inclusive time of
#            tidemark's own functions.
# callgrind: `valgrind --tool=callgrind` instruction counts (repeatable; ~50-100x slower, use a
#            small scale such as 200k payments).
# watermark: uprobes on tidemark's own lake::max_from_stats (entry and return), so the watermark
#            read is timed inside the real run; prints JSON {"calls": [{"us": ...}], ...} on stdout.
# PERF_FREQ (default 999 Hz) lowers the sampling rate for long runs (e.g. 99 for a full reload).
# Output: $BENCH_DIR/profiles/<tag>_<what>_<tool>.{data,txt,json}
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
P=200000; D=30; TOOL=perf; WHAT=inc
while [ $# -gt 0 ]; do
  case $1 in
    --payments) P=$2; shift 2 ;;
    --days) D=$2; shift 2 ;;
    --tool) TOOL=$2; shift 2 ;;
    --what) WHAT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 64 ;;
  esac
done
BENCH_DIR=${BENCH_DIR:-/work/bench}
TM=${TIDEMARK_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/tidemark}
PIPELINE=${TIDEMARK_PIPELINE:-$REPO/pipelines/payments.yml}
TAG=p${P}_d${D}
DATA=$BENCH_DIR/data/$TAG
OUT=$BENCH_DIR/profiles; mkdir -p "$OUT"
NAME=$OUT/${TAG}_${WHAT}_${TOOL}
[ -d "$DATA/tm_base" ] && [ -d "$DATA/bronze" ] || { echo "run scripts/bench.sh --payments $P --days $D first" >&2; exit 66; }

L=$DATA/work/profile_lake
rm -rf "$L"; mkdir -p "$L/bronze" "$L/silver"
ln -s "$DATA/bronze" "$L/bronze/payments_raw"
args=(run "$PIPELINE" --output json --var "lake=$L")
case $WHAT in
  inc) cp -r "$DATA/tm_base" "$L/silver/payments" ;;
  rerun) cp -r "$DATA/tm_base" "$L/silver/payments"; "$TM" "${args[@]}" > /dev/null 2>&1 ;;
  full) args+=(--full-reload); [ -n "${TM_FULL_ARGS-}" ] && read -ra extra <<<"$TM_FULL_ARGS" && args+=("${extra[@]}") ;;
  *) echo "--what inc|rerun|full" >&2; exit 64 ;;
esac

case $TOOL in
  perf)
    perf record -q -e cpu-clock -F "${PERF_FREQ:-999}" --call-graph dwarf,32768 -o "$NAME.data" -- "$TM" "${args[@]}" > "$NAME.json" 2> "$NAME.err"
    {
      echo "# $TM ${args[*]}"
      echo "# summary: $(cat "$NAME.json")"
      echo "## self time (top 60)"
      perf report -i "$NAME.data" --no-children --stdio --percent-limit 0.5 --sort symbol -g none 2>/dev/null | grep -v '^$' | head -80
      echo "## self time by crate (first path segment of the symbol; <T as Trait> counted under T's crate)"
      perf report -i "$NAME.data" --no-children --stdio --percent-limit 0 --sort dso,symbol -g none 2>/dev/null | python3 -c '
import collections, re, sys
agg = collections.Counter()
for l in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*)", l)
    if not m: continue
    pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
    s = sym.lstrip("<").lstrip("&").lstrip("*")
    s = re.sub(r"^(dyn |mut |const )", "", s)
    crate = s.split("::")[0] if "::" in s else ("[kernel]" if dso.startswith("[kernel") else f"{dso}: {s.split()[0][:40]}")
    agg[crate] += pct
for k, v in agg.most_common(30):
    print(f"{v:6.2f}%  {k}")'
      echo "## inclusive time (children), tidemark and delta/datafusion/parquet frames (top 80)"
      perf report -i "$NAME.data" --children --stdio --percent-limit 1 --sort symbol -g none 2>/dev/null | grep -v '^$' | head -100
    } > "$NAME.txt"
    ;;
  callgrind)
    valgrind --tool=callgrind --callgrind-out-file="$NAME.out" "$TM" "${args[@]}" > "$NAME.json" 2> "$NAME.err"
    {
      echo "# $TM ${args[*]}"
      callgrind_annotate --inclusive=yes "$NAME.out" 2>/dev/null | head -120
      echo "## self"
      callgrind_annotate "$NAME.out" 2>/dev/null | head -80
    } > "$NAME.txt"
    ;;
  watermark)
    sym=$(nm "$TM" | awk '$3 ~ /max_from_stats/ && $2 ~ /^[tT]$/ {print $3; exit}' || true)
    [ -n "$sym" ] || { echo '{"error": "max_from_stats is not a symbol of the binary (inlined?)"}'; rm -rf "$L"; exit 0; }
    # perf probe wants the file offset of the function (its symbol lookup fails on Rust names)
    vaddr=$(nm "$TM" | awk -v s="$sym" '$3 == s {print $1; exit}' || true)
    off=$(readelf -lW "$TM" | python3 -c '
import sys
v = int(sys.argv[1], 16)
for l in sys.stdin:
    f = l.split()
    if f[:1] == ["LOAD"]:
        fo, va, sz = int(f[1], 16), int(f[2], 16), int(f[4], 16)
        if va <= v < va + sz:
            print(hex(v - va + fo)); break' "$vaddr" || true)
    perf probe -q -d 'tmwm:*' >/dev/null 2>&1 || true
    perf probe -q -x "$TM" -a "tmwm:enter=$off" -a "tmwm:exit=$off%return" >/dev/null 2>&1 \
      || { echo '{"error": "perf probe (uprobes) unavailable"}'; rm -rf "$L"; exit 0; }
    perf record -q -e tmwm:enter -e tmwm:exit__return -o "$NAME.data" -- "$TM" "${args[@]}" > "$NAME.json" 2> "$NAME.err" || true
    perf probe -q -d 'tmwm:*' >/dev/null 2>&1 || true
    perf script -i "$NAME.data" -F time,event 2>/dev/null | python3 -c '
import json, sys
calls, t0 = [], None
for line in sys.stdin:
    parts = line.replace(":", " ").split()
    if not parts: continue
    t = float(parts[0])
    if "tmwm:enter" in line: t0 = t
    elif "tmwm:exit" in line and t0 is not None: calls.append({"us": round((t - t0) * 1e6, 1)}); t0 = None
run = json.load(open(sys.argv[1]))
print(json.dumps({"function": sys.argv[2], "calls": calls, "run_phases_ms": run.get("phases_ms"), "mode": run.get("mode")}))
' "$NAME.json" "$sym"
    rm -rf "$L"; exit 0
    ;;
  *) echo "--tool perf|callgrind|watermark" >&2; exit 64 ;;
esac
rm -rf "$L"
echo "$NAME.txt"
