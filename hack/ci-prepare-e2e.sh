#!/usr/bin/env bash
# CI only (hack/ci-test.sh): builds everything the e2e tier needs before any kind cluster exists,
# frees Go's build and module caches and the wheelhouse when the disk is short, then sets the e2e
# cluster up.
#
#   ci-prepare-e2e.sh build    the kind node, device plugin, Prometheus (and its operator) and kube-router images, and the CPU
#                              trainer image when the disk has room for it now
#   ci-prepare-e2e.sh finish   Go's caches removed when the disk is short (the unit tier's `go test`
#                              keeps caches of its own), the trainer image (if `build` left it), the
#                              wheelhouse removed when the disk is short
#   ci-prepare-e2e.sh cluster  after `finish`: the e2e tier's kind cluster from this commit (one left
#                              on the machine is removed first), set up as the e2e fixture does it
#                              (kube-router, the images in the nodes, device plugin, chart, Prometheus)
#   ci-prepare-e2e.sh all      build, finish and cluster, beside the test tiers (hack/ci-test.sh)
#
# Why: a CI machine's free disk varies (seen from under 50 GB to 80 GB). Built first, with Go's
# caches (about 14 GB after the Kubernetes, etcd, Prometheus and device-plugin builds) removed
# before the cluster starts when the disk is short, the peak is bounded by what is on disk at once, not by the cluster (one
# run failed with "no space left on device" when the trainer image, then 4.6 GB, was unpacked into
# the third worker beside Go's caches). Every step is cached, so the fixture's own calls afterwards
# take seconds and build nothing; nothing after `finish` runs `go` or installs from the wheelhouse.
# A developer machine never runs this: it keeps its caches.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# Free disk (GB) under which `build` leaves the trainer image to `finish`: its build needs about 10 GB
# transient (the wheels, the build stage) plus the 1.4 GB image, beside Go's caches.
TRAINER_BUILD_NEEDS_GB=${TRAINER_BUILD_NEEDS_GB:-25}
# Free disk (GB) under which `finish` removes Go's build and module caches (about 14 GB): above it they
# stay, and their removal (about a minute of disk work beside the test tiers) is not done.
GO_CACHES_KEEP_GB=${GO_CACHES_KEEP_GB:-35}
# Free disk (GB) under which `finish` removes the wheelhouse: the e2e cluster then needs about 10 GB
# (three workers holding the 1.4 GB trainer image, their own writes) and the tiers a few more.
WHEELHOUSE_KEEP_GB=${WHEELHOUSE_KEEP_GB:-20}

# Each step's duration also goes to $EBBFLOW_TIMINGS when set (.ci/run prints that file at the end).
last=""
step_started=$SECONDS
say() {
  if [[ -n $last && -n ${EBBFLOW_TIMINGS:-} ]]; then
    echo "  e2e preparation, $last: $((SECONDS - step_started)) s" >>"$EBBFLOW_TIMINGS"
  fi
  last=$1
  step_started=$SECONDS
  echo "[ci-prepare-e2e] $* (disk free: $(df -h --output=avail . | tail -1 | tr -d ' '))" >&2
}

free_gb() { df -BG --output=avail . | tail -1 | tr -dc '0-9'; }

# The kind nodes run the CPU trainer only, as the e2e fixture builds it (ebbflow_devtools.kind).
trainer_images() { TRAINER_VARIANTS=cpu bash hack/images/build-images.sh; }

build() {
  say "kind node image"
  bash hack/kind/build-node-image.sh >/dev/null
  say "fake GPU device plugin image"
  bash hack/fake-gpu-plugin/build-image.sh >/dev/null
  say "Prometheus and Prometheus Operator images"
  bash hack/build-tools.sh prometheus
  bash hack/prometheus/build-image.sh >/dev/null
  bash hack/prometheus-operator/build-image.sh >/dev/null
  say "Kueue image"
  bash hack/kueue/build-image.sh >/dev/null
  say "kube-router image (NetworkPolicy enforcement)"
  bash hack/kube-router/build-image.sh >/dev/null
  if (($(free_gb) >= TRAINER_BUILD_NEEDS_GB)); then
    say "operator and CPU trainer images"
    trainer_images
  else
    echo "[ci-prepare-e2e] $(free_gb) GB free, under $TRAINER_BUILD_NEEDS_GB GB: the trainer image waits for Go's caches to go" >&2
  fi
  say "images built"
}

finish() {
  if (($(free_gb) < GO_CACHES_KEEP_GB)); then
    say "removing Go's build and module caches ($(free_gb) GB free)"
    # Best effort: disk is what this buys, and hack/kind/load-image.sh frees more when short. A go
    # command still using the caches (another checkout's tests on the same machine) makes the removal
    # fail in part; that must not fail the run.
    go clean -cache -modcache || say "could not remove all of Go's caches (a go command still uses them); going on"
  fi
  say "operator and CPU trainer images (cached when already built)"
  trainer_images
  # The wheelhouse (3 GB) stays for the next run's image builds (a change to api/, operator/ or
  # trainer-image/ rebuilds an image; refilling it from PyPI took 150 s), unless the disk is short.
  if (($(free_gb) < WHEELHOUSE_KEEP_GB)); then
    say "images built: removing the wheelhouse they were installed from ($(free_gb) GB free)"
    rm -rf "${EBBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow}/wheelhouse"
  fi
  say "ready for the e2e tier"
}

# The cluster comes up while the trainer and integration tiers run, which mostly wait (on sleeps,
# rendezvous rounds, the API server): about 8 min here, the 1.4 GB CPU trainer image going into
# three workers the longest step (hack/kind/load-image.sh; docs/images.md for its size). A
# cluster already on the machine (a demo's, a bench's, one brought back by a Docker restart) is not
# this commit's: it may lack NetworkPolicy enforcement from its start, hold a node taken away and
# returned, or have moved its addresses; one such cluster was reused in 7 s and its workers never
# re-formed after a rescale, so it goes first.
cluster() {
  say "removing a kind cluster left on the machine"
  bash hack/kind/down.sh
  say "the e2e cluster (python -m ebbflow_devtools.kind)"
  .venv/bin/python -m ebbflow_devtools.kind
  say "e2e cluster ready"
}

all() {
  build
  finish
  cluster
}

case ${1:-} in
  build) build ;;
  finish) finish ;;
  cluster) cluster ;;
  all) all ;;
  *) echo "usage: $0 build|finish|cluster|all" >&2; exit 2 ;;
esac
