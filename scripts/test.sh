#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests need, then runs them all.
#
# The object-storage tests start a real S3-compatible server (s3s-fs, from crates.io) on
# loopback; it is installed once into target/tools (about 2 minutes the first time). The Kafka
# ingest tests start a real Kafka-protocol broker (tansu, from crates.io, in-memory storage) on
# loopback; installed once into target/tools too — a cold build takes about 30 minutes on 2
# cores, so set TANSU=/path/to/tansu to use a binary already built.
set -euo pipefail
cd "$(dirname "$0")/.."

S3S_FS_VERSION=0.14.1   # the newest s3s-fs that builds with this repository's Rust (1.95)
TANSU_VERSION=0.6.0     # the only tansu on crates.io; `dynostore` gives the memory:// engine
tools="$PWD/target/tools"
if [ -z "${S3S_FS:-}" ] && [ ! -x "$tools/bin/s3s-fs" ]; then
  echo "installing s3s-fs $S3S_FS_VERSION into $tools (S3-compatible test server)" >&2
  cargo install --quiet --locked --root "$tools" s3s-fs --version "$S3S_FS_VERSION" --features binary
fi
if [ -z "${TANSU:-}" ] && [ ! -x "$tools/bin/tansu" ]; then
  echo "installing tansu $TANSU_VERSION into $tools (Kafka-protocol test broker; ~30 min cold)" >&2
  cargo install --quiet --locked --root "$tools" tansu --version "$TANSU_VERSION" --features dynostore
fi

cargo test "$@"
