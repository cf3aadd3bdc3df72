#!/usr/bin/env bash
# Runs each libFuzzer harness of a CKPT_BUILD_FUZZ build for a bounded time, starting from the
# seed corpus in tests/fuzz/corpus (new inputs go to <build>/fuzz-corpus, crashes to
# <build>/fuzz-artifacts). Prints each harness's executions; exits non-zero if any crashed.
#
# Usage: scripts/run-fuzzers.sh <build dir> <seconds per harness> [harness ...]
set -euo pipefail
build=${1:?build dir}
seconds=${2:?seconds per harness}
shift 2
harnesses=("$@")
if [[ ${#harnesses[@]} -eq 0 ]]; then
  harnesses=(safetensors policy_json tensor_decode lossy_roundtrip http_request)
fi
root=$(cd "$(dirname "$0")/.." && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
failed=0
for name in "${harnesses[@]}"; do
  corpus="$build/fuzz-corpus/$name"
  artifacts="$build/fuzz-artifacts/$name/"
  mkdir -p "$corpus" "$artifacts"
  log="$build/fuzz-$name.log"
  echo "fuzz: $name for ${seconds}s (log $log)"
  if "$build/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="$artifacts" "$corpus" "$root/tests/fuzz/corpus/$name" >"$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz: $name passed: ${execs:-?} executions, corpus $(ls "$corpus" | wc -l) inputs"
  else
    echo "fuzz: $name FAILED; the input is in $artifacts; the end of the log:"
    tail -40 "$log"
    failed=1
  fi
done
exit $failed
