#!/usr/bin/env bash
# Smoke-tests the images hack/images/build-images.sh built, the way a cluster runs them: as their
# non-root user, with a read-only root filesystem, a tmpfs at /tmp and no network.
#   operator   `ebbflow-operator --help` (imports kopf, the kubernetes client and every handler)
#   trainer    `ebbflow-train run ... --help`, then a rendezvous and two nodes training
#              examples/digits for 20 steps (gloo, torch elastic) in one container
# Why: `docker build` succeeding proves little about an image that must start read-only, unprivileged
# and offline; this does, in about a minute, without a cluster.
#
# Usage: hack/images/smoke-test.sh [IMAGE_TAG_SUFFIX]  (default dev: ebbflow/operator:dev,
#        ebbflow/trainer:dev and, when present, ebbflow/trainer:dev-cpu)
set -euo pipefail

TAG=${1:-dev}
RUN=(docker run --rm --read-only --tmpfs /tmp --network none)
fail() {
  echo "smoke-test: FAILED: $*" >&2
  exit 1
}
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

operator=ebbflow/operator:$TAG
image_exists "$operator" || fail "$operator missing: run hack/images/build-images.sh"
"${RUN[@]}" "$operator" --help >/dev/null || fail "$operator --help"
[[ $(docker image inspect -f '{{.Config.User}}' "$operator") == 65532:65532 ]] || fail "$operator not USER 65532"
echo "smoke-test: $operator ok" >&2

# Two nodes of one job in one container, as in docs/trainer.md "Running locally".
train_script='
set -e
export EBBFLOW_RDZV_ENDPOINT=127.0.0.1:29400 EBBFLOW_RDZV_ID=smoke EBBFLOW_MIN_REPLICAS=2 \
  EBBFLOW_MAX_REPLICAS=2 EBBFLOW_VIRTUAL_NODES=4 EBBFLOW_GLOBAL_BATCH_SIZE=32 \
  EBBFLOW_CHECKPOINT_PATH=/tmp/checkpoints EBBFLOW_METRICS_PORT=0 EBBFLOW_RDZV_JOIN_TIMEOUT_SECONDS=120
ebbflow-train rendezvous --host 127.0.0.1 & rdzv=$!
pids=()
for n in 0 1; do
  ebbflow-train run examples/digits/train.py --steps 20 --state-dir /tmp/node$n --journal /tmp/journal$n &
  pids+=($!)
done
wait ${pids[0]}
wait ${pids[1]}
kill $rdzv
grep -q "\"event\": \"done\"" /tmp/journal0
'
for trainer in "ebbflow/trainer:$TAG" "ebbflow/trainer:$TAG-cpu"; do
  if ! image_exists "$trainer"; then
    [[ $trainer == *-cpu ]] && continue
    fail "$trainer missing: run hack/images/build-images.sh"
  fi
  "${RUN[@]}" "$trainer" run /opt/ebbflow/examples/digits/train.py --help >/dev/null || fail "$trainer --help"
  start=$SECONDS
  log=$(mktemp "${TMPDIR:-/tmp}/ebbflow-smoke.XXXXXX")
  if ! timeout 300 "${RUN[@]}" --entrypoint tini "$trainer" -- bash -c "$train_script" >"$log" 2>&1; then
    grep -v -e '^\[W' -e 'Warning' "$log" | tail -30 >&2
    fail "$trainer: two-node digits training (log: $log)"
  fi
  rm -f "$log"
  echo "smoke-test: $trainer ok (two nodes, 20 steps in $((SECONDS - start)) s)" >&2
done
