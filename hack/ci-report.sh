#!/usr/bin/env bash
# Prints CI's timings (the lines "STEP: N s" that .ci/run and the scripts it calls append to one
# file) with, beside each step that has one, its budget from .ci/budgets for this kind of machine,
# marked OVER when the step took longer. A step that grows is seen in the run that grew it.
#
# Usage: hack/ci-report.sh TIMINGS warm|cold
set -euo pipefail
timings=${1:?usage: $0 TIMINGS warm|cold}
machine=${2:?usage: $0 TIMINGS warm|cold}
case $machine in
  warm) column=2 ;;
  cold) column=3 ;;
  *) echo "usage: $0 TIMINGS warm|cold" >&2; exit 2 ;;
esac
budgets=$(dirname "$0")/../.ci/budgets
echo "--- steps on this machine ($machine machine; budgets from .ci/budgets) ---"
awk -F'\t' -v column="$column" '
  FNR == NR { if ($0 !~ /^#/ && NF >= 3) budget[$1] = $column; next }
  {
    name = $0; sub(/: [0-9]+ s$/, "", name); sub(/^ +/, "", name)
    seconds = $0; sub(/.*: /, "", seconds); sub(/ s$/, "", seconds)
    if (name in budget) {
      over = seconds + 0 > budget[name] + 0 ? "  OVER" : ""
      printf "%-72s of %5d s%s\n", $0, budget[name], over
    } else print $0
  }' "$budgets" "$timings"
