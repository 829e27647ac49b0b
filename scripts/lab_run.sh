#!/usr/bin/env bash
# Maintainers' batch for a lab GPU: record chapters, then check the claims on the new
# recordings. Logs go to $LOGS (default ./lab-logs). Usage:
#   scripts/lab_run.sh record 1 2 3 4     # record these chapters (each under a time limit)
#   scripts/lab_run.sh gpu-tests [ARGS]   # pytest -m gpu with per-test time limits
set -u
LOGS=${LOGS:-lab-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
what=$1; shift
case "$what" in
  record)
    for ch in "$@"; do
      start=$(date +%s)
      timeout "${CHAPTER_LIMIT_S:-300}" python3 -m experiments record --chapter "$ch" --quiet > "$LOGS/record-ch$ch.log" 2>&1
      rc=$?
      echo "chapter $ch: rc=$rc in $(( $(date +%s) - start )) s; $(grep -c '^wrote' "$LOGS/record-ch$ch.log") files; failed: $(grep '^FAILED' "$LOGS/record-ch$ch.log" | tr '\n' ' ')"
    done
    python3 -m experiments claims --recorded > "$LOGS/claims.txt" 2>&1
    grep -E '^\[' "$LOGS/claims.txt"
    ;;
  gpu-tests)
    timeout "${TESTS_LIMIT_S:-480}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 150 -rfE "$@" > "$LOGS/gpu-tests.log" 2>&1
    echo "gpu tests rc=$?"
    grep -E "passed|failed|^FAILED|^ERROR" "$LOGS/gpu-tests.log" | tail -40
    ;;
  *) echo "unknown step $what" >&2; exit 2 ;;
esac
