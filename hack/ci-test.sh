#!/usr/bin/env bash
# `make test` under CI=true: every tier, e2e included, in the least wall time a 2-core machine allows.
#
# Everything the e2e tier needs is prepared in the background while lint, typecheck and the unit,
# trainer and integration tiers run (hack/ci-prepare-e2e.sh all): the images (Go builds, Debian
# packages, pip), then, once the unit tier's `go test` is done with Go's caches, the caches removed
# and the e2e cluster set up (the trainer image loaded into three nodes: about 6 minutes). The
# tiers spend much of their time waiting on processes and the API server (the trainer and
# integration tiers run two tests at a time). Then the e2e tier runs on that cluster, which is
# removed whatever the outcome.
# Not beside the trainer tier (tried 2026-11-27, two fresh-clone runs): the whole run took 4,079 s
# instead of about 4,800, but on two saturated cores a launcher took 50 s to start, and each run lost
# one trainer-tier test whose scenario needs a worker started within a window (a newcomer before a
# 40 s job ends; three workers at step 10 within 120 s). Those windows come first.
# Exit status: the first failure's.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# The slowest tests of each tier are listed at its end: where the next minutes of CI time are.
PYTEST=(.venv/bin/python -m pytest --durations=15)
timings=${EBBFLOW_TIMINGS:-/dev/null}
prepare_log=$(mktemp "${TMPDIR:-/tmp}/ci-prepare-e2e.XXXXXX")
unit_done="$prepare_log.unit-done"

# In its own process group, so that a failed tier stops every build it started; the cluster it may
# have made goes too.
setsid bash hack/ci-prepare-e2e.sh all "$unit_done" >"$prepare_log" 2>&1 &
prepare=$!
trap 'kill -- -"$prepare" 2>/dev/null; bash hack/kind/down.sh >/dev/null 2>&1; rm -f "$unit_done"' EXIT

started=$SECONDS
status=0
make --no-print-directory lint typecheck || status=$?
# Two at a time too: 1,788 unit tests took 206 s in one process beside the image builds.
((status)) || "${PYTEST[@]}" -n 2 -m unit tests || status=$?
touch "$unit_done"
# Two tests at a time: the trainer tier's processes mostly wait (on sleeps standing in for compute,
# rendezvous rounds, signals): alone it used 0.62 of one core over 27 min. Each xdist worker starts
# its own control plane for the integration tests (free ports: two run side by side).
((status)) || "${PYTEST[@]}" -n 2 --dist worksteal -m "trainer or integration" tests || status=$?
echo "lint, typecheck, unit, trainer and integration tiers (beside the e2e preparation): $((SECONDS - started)) s" >>"$timings"
if ((status)); then exit "$status"; fi

started=$SECONDS
wait "$prepare"
prepared=$?
echo "--- e2e preparation (hack/ci-prepare-e2e.sh all: images, cluster), exit $prepared ---"
cat "$prepare_log"
echo "waiting for the e2e preparation after the tiers: $((SECONDS - started)) s" >>"$timings"
if ((prepared)); then exit "$prepared"; fi

"${PYTEST[@]}" e2e || status=$?
exit "$status"
