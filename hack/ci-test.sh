#!/usr/bin/env bash
# `make test` under CI=true: every tier, e2e included, in the least wall time a 2-core machine allows.
#
# Two lanes after the virtualenv: (1) lint, typecheck, the unit tier, then the trainer and
# integration tiers (two tests at a time); (2) everything the e2e tier needs, prepared in the
# background from the start (hack/ci-prepare-e2e.sh all: the images, then the kind cluster). The e2e
# tier runs once both are done, on a machine that does nothing else, and does not check the set-up
# again (EBBFLOW_E2E_PREPARED): beside the trainer and integration tiers it took about twice as long
# (its pods start, import torch and form worlds on the cores those tiers use), and the whole run
# longer than one after the other. Why this order, and what each step took: docs/ci.md.
# Exit status: the first failure's (lint, typecheck, unit, then trainer/integration, then e2e); a
# failed lint, typecheck or unit tier skips the e2e tier.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# The slowest tests of each tier are listed at its end: where the next minutes of CI time are. Every
# test's duration is kept in a JUnit XML file per tier ($EBBFLOW_TEST_RESULTS, default beside the
# timings) for the budget's bookkeeping. Short tracebacks: a failure's report keeps room near its head
# for the cluster's state (e2e/diagnostics.py).
PYTEST=(.venv/bin/python -m pytest --durations=15 --tb=short)
results=${EBBFLOW_TEST_RESULTS:-${TMPDIR:-/tmp}/ebbflow-ci-results}
mkdir -p "$results"
timings=${EBBFLOW_TIMINGS:-/dev/null}
prepare_log=$(mktemp "${TMPDIR:-/tmp}/ci-prepare-e2e.XXXXXX")
tiers_log=$(mktemp "${TMPDIR:-/tmp}/ci-trainer-integration.XXXXXX")

# CPU seconds beside the wall times (hack/ci-cpu.sh): each lane's own processes, counted by bash
# (`times`: the children it has waited for), the kind cluster's containers, the whole machine.
cpu_scratch=$(mktemp "${TMPDIR:-/tmp}/ci-cpu.XXXXXX")
children_cpu() { # sets CHILDREN_CPU: CPU seconds of this shell's waited-for children so far
  # `times` in a command substitution would count that subshell's children: through a file per shell.
  local file="$cpu_scratch.$BASHPID"
  times >"$file"
  CHILDREN_CPU=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); print int(u[1] * 60 + u[2] + s[1] * 60 + s[2]) }' "$file")
}
# A lane's CPU is counted in a subshell of its own: this shell also reaps the other lane when it ends,
# and its `times` would add that lane's processes to whichever step it measured next.
cpu_of() { # cpu_of FILE COMMAND...: run COMMAND (in a subshell); the CPU seconds of its processes to FILE
  local file=$1 status=0
  shift
  "$@" || status=$?
  children_cpu
  echo "$CHILDREN_CPU" >"$file"
  return "$status"
}
machine_cpu_started=$(bash hack/ci-cpu.sh machine)

# In their own process groups, so that a failure stops every build and test they started; the
# cluster the preparation may have made goes too.
test_started=$SECONDS
prepare_cpu="$cpu_scratch.prepare"
set -m # its own process group
(cpu_of "$prepare_cpu" bash hack/ci-prepare-e2e.sh all) >"$prepare_log" 2>&1 &
prepare=$!
set +m
tiers=""
trap 'kill -- -"$prepare" 2>/dev/null; [[ -n $tiers ]] && kill -- -"$tiers" 2>/dev/null;
  bash hack/kind/down.sh >/dev/null 2>&1' EXIT

unit_log=$(mktemp "${TMPDIR:-/tmp}/ci-unit.XXXXXX")
unit_failed="$unit_log.failed"
# Lane 1, two tests at a time in each tier (docs/ci.md says why two); each xdist worker starts its own
# control plane for the integration tests (free ports: two run side by side).
unit_then_tiers() {
  local start=$SECONDS status=0
  {
    make --no-print-directory lint typecheck &&
      "${PYTEST[@]}" -n 2 -m unit --junitxml="$results/unit.xml" tests
  } >"$unit_log" 2>&1 || status=$?
  echo "lint, typecheck and unit tier: $((SECONDS - start)) s" >>"$timings"
  children_cpu
  local unit_cpu=$CHILDREN_CPU
  echo "  CPU of lint, typecheck and the unit tier: $unit_cpu s" >>"$timings"
  if ((status)); then
    touch "$unit_failed"
    return "$status"
  fi
  start=$SECONDS
  "${PYTEST[@]}" -n 2 --dist worksteal -m "trainer or integration" --junitxml="$results/trainer-integration.xml" \
    tests >"$tiers_log" 2>&1 || status=$?
  echo "trainer and integration tiers: $((SECONDS - start)) s" >>"$timings"
  children_cpu
  echo "  CPU of the trainer and integration tiers' processes: $((CHILDREN_CPU - unit_cpu)) s" >>"$timings"
  return "$status"
}
set -m # its own process group, as the preparation's
unit_then_tiers &
tiers=$!
set +m

wait "$prepare"
prepared=$?
echo "--- e2e preparation (hack/ci-prepare-e2e.sh all: images, cluster), exit $prepared ---"
cat "$prepare_log"
echo "e2e preparation: $((SECONDS - test_started)) s" >>"$timings"
echo "  CPU of the e2e preparation's processes (outside the kind nodes): $(cat "$prepare_cpu") s" >>"$timings"
wait "$tiers"
tiers_status=$?
tiers=""
echo "--- lint, typecheck and unit tier ---"
cat "$unit_log"
if [[ ! -e $unit_failed ]]; then
  echo "--- trainer and integration tiers, exit $tiers_status ---"
  cat "$tiers_log"
fi
e2e_status=$prepared
if [[ -e $unit_failed ]]; then
  echo "--- e2e tier skipped: lint, typecheck or the unit tier failed (above) ---"
elif ((prepared == 0)); then
  # The preparation set the cluster up from this commit: the e2e fixture does not check it again.
  e2e_started=$SECONDS
  e2e_cpu="$cpu_scratch.e2e"
  (cpu_of "$e2e_cpu" env EBBFLOW_E2E_PREPARED=1 "${PYTEST[@]}" --junitxml="$results/e2e.xml" e2e) || e2e_status=$?
  echo "e2e tier: $((SECONDS - e2e_started)) s" >>"$timings"
  echo "  CPU of the e2e tier's pytest (kubectl, helm, logs): $(cat "$e2e_cpu") s" >>"$timings"
  echo "  CPU of the kind nodes (the set-up, the operator, Prometheus, the e2e pods):" \
    "$(bash hack/ci-cpu.sh containers ebbflow-) s" >>"$timings"
fi
echo "every tier, after the virtualenv: $((SECONDS - test_started)) s" >>"$timings"
echo "  CPU of the whole machine meanwhile: $(($(bash hack/ci-cpu.sh machine) - machine_cpu_started)) s" \
  "of $(($(nproc) * (SECONDS - test_started))) s on $(nproc) cores" >>"$timings"
((tiers_status)) && exit "$tiers_status"
exit "$e2e_status"
