#!/usr/bin/env bash
# `make test` under CI=true: every tier, e2e included, in the least wall time a 2-core machine allows.
#
# Everything the e2e tier needs is prepared in the background while lint, typecheck and the unit
# tier run (hack/ci-prepare-e2e.sh all): the images (Go builds, Debian packages, pip), then, once
# the unit tier's `go test` is done with Go's caches, the caches removed and the e2e cluster set up
# (the trainer image loaded into three nodes: about 10 minutes). The e2e tier does not check that
# set-up again (EBBFLOW_E2E_PREPARED: 106 s at stop 35). Tried and dropped: setting the cluster up
# while the unit tier ran (a warm machine had the room). The e2e tier then began 400 s sooner, in
# the trainer tier's busiest part: at a load average of 25-41 the e2e trainers' rendezvous
# heartbeats missed their 3 s budget (10 s since) again and again, and the dashboard test's job never trained
# on three workers within 420 s; the unit tier took 401 s instead of 151. The trainer and integration tiers
# start with the cluster set-up, and the e2e tier starts as soon as its cluster is ready, beside
# them: all three mostly wait (on sleeps standing in for device time, rendezvous rounds, signals,
# the API server and the kubelets). One after the other they took 2,351 s + 2,290 s on the last CI
# run that ran them so (stop 34), with about one core idle; side by side 4,079 s and 4,185 s for
# the whole run. Every trainer-tier scenario that needs several launchers in one world holds its
# training until they have joined (Job.start_held): on two saturated cores a launcher once took
# 50 s to start, and a short job ended before a newcomer arrived.
# Exit status: the first failure's (lint, typecheck, unit, then trainer/integration, then e2e).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# The slowest tests of each tier are listed at its end: where the next minutes of CI time are. Every
# test's duration is kept in a JUnit XML file per tier ($EBBFLOW_TEST_RESULTS, default beside the
# timings) for the budget's bookkeeping.
PYTEST=(.venv/bin/python -m pytest --durations=15)
results=${EBBFLOW_TEST_RESULTS:-${TMPDIR:-/tmp}/ebbflow-ci-results}
mkdir -p "$results"
timings=${EBBFLOW_TIMINGS:-/dev/null}
prepare_log=$(mktemp "${TMPDIR:-/tmp}/ci-prepare-e2e.XXXXXX")
tiers_log=$(mktemp "${TMPDIR:-/tmp}/ci-trainer-integration.XXXXXX")
unit_done="$prepare_log.unit-done"

# In their own process groups, so that a failure stops every build and test they started; the
# cluster the preparation may have made goes too.
setsid bash hack/ci-prepare-e2e.sh all "$unit_done" >"$prepare_log" 2>&1 &
prepare=$!
tiers=""
trap 'kill -- -"$prepare" 2>/dev/null; [[ -n $tiers ]] && kill -- -"$tiers" 2>/dev/null;
  bash hack/kind/down.sh >/dev/null 2>&1; rm -f "$unit_done"' EXIT

started=$SECONDS
status=0
make --no-print-directory lint typecheck || status=$?
# Two at a time: 1,788 unit tests took 206 s in one process beside the image builds.
((status)) || "${PYTEST[@]}" -n 2 -m unit --junitxml="$results/unit.xml" tests || status=$?
touch "$unit_done"
echo "lint, typecheck and unit tier: $((SECONDS - started)) s" >>"$timings"
if ((status)); then exit "$status"; fi

# Two tests at a time: the trainer tier's processes mostly wait: alone it used 0.62 of one core over
# 27 min. Each xdist worker starts its own control plane for the integration tests (free ports: two
# run side by side). Its output is printed once it ends, whole (not interleaved with the e2e tier's).
run_tiers() {
  local start=$SECONDS status=0
  "${PYTEST[@]}" -n 2 --dist worksteal -m "trainer or integration" --junitxml="$results/trainer-integration.xml" \
    tests >"$tiers_log" 2>&1 || status=$?
  echo "trainer and integration tiers: $((SECONDS - start)) s" >>"$timings"
  return "$status"
}
started=$SECONDS
set -m # its own process group, as the preparation's
run_tiers &
tiers=$!
set +m

wait "$prepare"
prepared=$?
echo "--- e2e preparation (hack/ci-prepare-e2e.sh all: images, cluster), exit $prepared ---"
cat "$prepare_log"
echo "e2e preparation after the unit tier: $((SECONDS - started)) s" >>"$timings"
e2e_status=$prepared
if ((prepared == 0)); then
  # The preparation set the cluster up from this commit: the e2e fixture does not check it again.
  e2e_started=$SECONDS
  EBBFLOW_E2E_PREPARED=1 "${PYTEST[@]}" --junitxml="$results/e2e.xml" e2e || e2e_status=$?
  echo "e2e tier: $((SECONDS - e2e_started)) s" >>"$timings"
fi

wait "$tiers"
tiers_status=$?
tiers=""
echo "--- trainer and integration tiers, exit $tiers_status ---"
cat "$tiers_log"
echo "trainer, integration and e2e tiers: $((SECONDS - started)) s" >>"$timings"
((tiers_status)) && exit "$tiers_status"
exit "$e2e_status"
