#!/usr/bin/env bash
# Several parts of the GPU suite side by side on one GPU, each a scripts/gpu-check.sh of its own:
#   source .whl/prelude.sh && scripts/gpu-streams.sh --budget-s N "PYTEST ARGS 1" "PYTEST ARGS 2" ...
# The machine-wide GPU lane keeps their timings and profiles apart; what measures nothing (builds,
# checks) runs side by side, so the parts finish sooner than one after another (each test runs
# about twice as long as alone). Stream K logs under $OUT/sK (default ./out/sK); at the end each
# stream's summary line is printed, and every log is packed into $OUT/streams.tgz (one file, for
# callers that fetch only a few). Exits non-zero when any stream did.
set -uo pipefail
OUT=${OUT:-out}
here="$(cd "$(dirname "$0")" && pwd)"
budget=()
if [ "${1:-}" = "--budget-s" ]; then
  budget=(--budget-s "$2")
  shift 2
fi
if [ "$#" -eq 0 ]; then
  echo "usage: scripts/gpu-streams.sh [--budget-s N] \"PYTEST ARGS\" [\"PYTEST ARGS\" ...]" >&2
  exit 2
fi
mkdir -p "$OUT"
pids=()
k=0
for stream in "$@"; do
  k=$((k + 1))
  mkdir -p "$OUT/s$k"
  # word-split on purpose: each stream is one string of pytest arguments
  # shellcheck disable=SC2086
  OUT="$OUT/s$k" "$here/gpu-check.sh" "${budget[@]}" $stream > "$OUT/s$k/stdout.txt" 2>&1 &
  pids+=("$!")
  echo "stream $k (pid $!): $stream"
done
rc=0
k=0
for pid in "${pids[@]}"; do
  k=$((k + 1))
  wait "$pid"
  code=$?
  [ "$code" -ne 0 ] && rc=$code
  echo "stream $k: exit $code: $(grep -E '^=+ .* in [0-9.]+s' "$OUT/s$k/gpu-tests.log" | tail -n 1)"
done
tar -czf "$OUT/streams.tgz" -C "$OUT" $(cd "$OUT" && ls -d s*/) 2>/dev/null
exit "$rc"
