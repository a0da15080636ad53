#!/usr/bin/env bash
# Prints the Python of the venv the content checks and read benchmarks use (DuckDB with its
# `delta` extension, and the deltalake package), creating it on first use:
# $BENCH_ROOT/.venv-duck (default /work/bench/.venv-duck), from PyPI.
set -euo pipefail
V=${BENCH_ROOT:-/work/bench}/.venv-duck
if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import duckdb, duckdb_extension_delta, deltalake, pytz" 2>/dev/null; then
  echo "setting up $V (duckdb 1.5.5 + duckdb-extension-delta, deltalake 1.6.6)" >&2
  python3 -m venv "$V"
  "$V/bin/pip" install -q duckdb==1.5.5 duckdb-extension-delta deltalake==1.6.6 pyarrow pytz >&2
fi
echo "$V/bin/python"
