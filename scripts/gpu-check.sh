#!/usr/bin/env bash
# The GPU suite in one command, for a CUDA machine:
#   source .whl/prelude.sh && scripts/gpu-check.sh [--budget-s N] [PYTEST ARGS...]
# Runs every `gpu`-marked test (or the given paths/args), logging under $OUT (default ./out).
# --budget-s N: no test starts after N seconds (the rest are skipped, saying so), so the run ends
# by itself with its summary inside a device call's limit: give the limit less the longest test.
# Each failure's traceback goes to $OUT/failures.txt the moment it happens; what every test printed
# (the figures it measured) to $OUT/junit.xml.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export KBMCP_FAILURE_LOG="$OUT/failures.txt"
if [ "${1:-}" = "--budget-s" ]; then
  export KBMCP_TEST_DEADLINE=$(( $(date +%s) + $2 ))
  shift 2
fi
{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  (ncu --version 2>/dev/null | tail -n 1) || echo "no ncu"
} | tee "$OUT/device.txt"
if [ "$#" -eq 0 ]; then set -- tests; fi
# junit.xml keeps what each test printed (its measured figures), passed ones included, out of the log
python3 -m pytest -m gpu -v -rs --durations=25 -p no:cacheprovider -o junit_logging=system-out \
  --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
