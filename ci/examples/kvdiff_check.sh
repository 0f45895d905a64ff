#!/bin/sh
# The sh_test of BUILD.bazel: kvdiff reads the shard from Bazel's environment.
set -eu
exec "$TEST_SRCDIR/kvdiff/kvdiff" check --cases 2000 --seed 1 \
  --json "$TEST_UNDECLARED_OUTPUTS_DIR/shard-$TEST_SHARD_INDEX.json" \
  --junit "$XML_OUTPUT_FILE" --out-dir "$TEST_UNDECLARED_OUTPUTS_DIR/failures"
