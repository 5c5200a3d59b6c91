#!/usr/bin/env bash
# `make test` under CI=true: every tier, e2e included, in the least wall time a 2-core machine allows.
#
# The e2e tier's images (hack/ci-prepare-e2e.sh build: Go builds, Debian packages, pip) are built in
# the background while lint, typecheck and the unit, trainer and integration tiers run: the tiers
# spend much of their time waiting on processes and the API server, the builds on downloads. Go's
# caches are removed only after both (the unit tier runs `go test`), then the e2e tier runs on a kind
# cluster made for it (one left on the machine is removed first) and removed whatever the outcome. Exit status: the first failure's.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTEST=(.venv/bin/python -m pytest)
timings=${EBBFLOW_TIMINGS:-/dev/null}
prepare_log=$(mktemp "${TMPDIR:-/tmp}/ci-prepare-e2e.XXXXXX")

# In its own process group, so that a failed tier stops every build it started.
setsid bash hack/ci-prepare-e2e.sh build >"$prepare_log" 2>&1 &
prepare=$!
trap 'kill -- -"$prepare" 2>/dev/null' EXIT

started=$SECONDS
status=0
make --no-print-directory lint typecheck || status=$?
((status)) || "${PYTEST[@]}" -m "unit or trainer or integration" tests || status=$?
echo "lint, typecheck, unit, trainer and integration tiers (beside the image builds): $((SECONDS - started)) s" >>"$timings"
if ((status)); then exit "$status"; fi

started=$SECONDS
wait "$prepare"
built=$?
echo "--- e2e image builds (hack/ci-prepare-e2e.sh build), exit $built ---"
cat "$prepare_log"
echo "waiting for the image builds after the tiers: $((SECONDS - started)) s" >>"$timings"
if ((built)); then exit "$built"; fi

bash hack/ci-prepare-e2e.sh finish || exit $?
# The e2e tier runs on a cluster this commit builds. A cluster already on the machine (a demo's or a
# bench's left up, one brought back by a Docker restart) is not that: it may lack NetworkPolicy
# enforcement from its start, hold a node taken away and returned, or have moved its addresses, and
# `hack/kind/up.sh` would only wait for it. One such cluster was reused in 7 s and its workers never
# re-formed after a rescale, so it goes first.
bash hack/kind/down.sh || true
"${PYTEST[@]}" e2e || status=$?
bash hack/kind/down.sh || true
exit "$status"
