#!/usr/bin/env bash
# Makes sure a Docker daemon answers: installs Debian's docker.io when dockerd is missing and starts
# dockerd in the background (log: $EBBFLOW_CACHE/dockerd.log). Does nothing when `docker info` works.
#
# This machine kind has no init system for services, so dockerd is started by hand; on a workstation
# with Docker running already this returns at once.
set -euo pipefail

EBBFLOW_CACHE=${EBBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow}
mkdir -p "$EBBFLOW_CACHE"

if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "installing docker.io (Debian) for dockerd"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
echo "starting dockerd (log: $EBBFLOW_CACHE/dockerd.log)"
# In a session of its own: CI stops its background steps by process group (hack/ci-test.sh), and a
# dockerd started by one of them went with it, before the cluster could be deleted; docker then
# started the cluster's containers again with the next dockerd (108 s to remove at the next run).
setsid nohup dockerd >"$EBBFLOW_CACHE/dockerd.log" 2>&1 </dev/null &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "dockerd did not answer within 60 s; see $EBBFLOW_CACHE/dockerd.log" >&2
tail -20 "$EBBFLOW_CACHE/dockerd.log" >&2
exit 1
