#!/usr/bin/env bash
# Builds the docs book (docs/, mdBook) into target/book; open target/book/index.html.
# mdBook is installed once into target/tools (a few minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.4.52
tools="$PWD/target/tools"
mdbook="${MDBOOK:-$tools/bin/mdbook}"
if [ ! -x "$mdbook" ]; then
  echo "installing mdbook $MDBOOK_VERSION into $tools" >&2
  cargo install --quiet --locked --root "$tools" mdbook --version "$MDBOOK_VERSION"
fi
"$mdbook" build docs
echo "book: $PWD/target/book/index.html"
