#!/usr/bin/env bash
# The cost of expectations on a full reload: the same `tidemark run --full-reload` of the bench's
# bronze with no expectations and with ten (the README's kind: a range, sets, lengths, prefixes,
# the two clocks' order), alternating, each run its own process under /usr/bin/time.
#
#   scripts/expect_bench.sh BRONZE WORKDIR [REPS]
#
# Environment: TIDEMARK_BIN (default target/release/tidemark).
set -euo pipefail
bronze=${1:?usage: scripts/expect_bench.sh BRONZE WORKDIR [REPS]}
work=${2:?usage: scripts/expect_bench.sh BRONZE WORKDIR [REPS]}
reps=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TIDEMARK_BIN:-$here/target/release/tidemark}
mkdir -p "$work"
work=$(cd "$work" && pwd)
bronze=$(cd "$bronze" && pwd)

pipeline() { # name rules
  cat >"$work/$1.yml" <<YML
name: $1
kind: cdc_merge
source: { uri: "$bronze" }
target: { uri: "$work/$1_silver" }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "$work/$1_quarantine" }
$2
YML
}
pipeline plain ""
pipeline rules "expectations:
  - { name: amount_non_negative, sql: \"amount_cents >= 0\" }
  - { name: known_currency, sql: \"currency IN ('USD','EUR','GBP','CAD','AUD','JPY','CHF')\", on_fail: quarantine }
  - { name: id_length, sql: \"length(payment_id) = 16\" }
  - { name: known_status, sql: \"status IN ('created','authorized','captured','failed','refunded')\" }
  - { name: updated_after_created, sql: \"updated_at >= created_at\" }
  - { name: arrived_after_event, sql: \"_ingested_at >= updated_at\" }
  - { name: known_op, sql: \"op IN ('U','D')\", on_fail: quarantine }
  - { name: customer_prefix, sql: \"customer_id LIKE 'cus_%'\" }
  - { name: merchant_prefix, sql: \"merchant_id LIKE 'mch_%'\" }
  - { name: amount_bounded, sql: \"amount_cents < 100000000\" }"

for i in $(seq "$reps"); do
  for side in plain rules; do
    start=$(date +%s%N)
    /usr/bin/time -f %M -o "$work/rss" "$bin" run "$work/$side.yml" --full-reload --output json >"$work/$side.json"
    end=$(date +%s%N)
    ms=$(((end - start) / 1000000))
    echo "$side rep=$i wall_s=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000))) peak_rss_mib=$(($(tail -1 "$work/rss") / 1024)) $(grep -o '"num_source_rows_read":[0-9]*\|"num_quarantined":[0-9]*' "$work/$side.json" | tr '\n' ' ')"
  done
done
