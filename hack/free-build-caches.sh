#!/usr/bin/env bash
# Makes sure NEEDED_MB of disk are free where Docker keeps its data, removing what only building
# needed, until enough is free: the wheelhouse the images were installed from, then Go's build and
# module caches of the tools and images built here (the Makefile keeps them under the project's
# cache, $EBBFLOW_CACHE/go, never the user's own), last the plugin tests' own (about 650 MB, see
# tests/unit/test_fake_gpu_plugin.py). Each removal is printed on stdout with its size.
# Exits 1 with what to do when even that is not enough.
#
# Why: loading the CPU trainer image into three kind nodes needs about 5 GB (14 GB when it weighed
# 4.5 GB) on top of the images, tools and caches a first `make demo` builds; a machine with under
# 50 GB free ran out of disk there. Everything removed is rebuilt or refilled on demand (tools and images stay cached).
#
# Usage: hack/free-build-caches.sh NEEDED_MB WHAT
set -euo pipefail

needed=${1:?usage: $0 NEEDED_MB WHAT}
what=${2:-this step}
EBBFLOW_CACHE=${EBBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow}
docker_root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || true)
[[ -d $docker_root ]] || docker_root=/

free_mb() { df -Pm "$docker_root" | awk 'NR == 2 { print $4 }'; }
enough() { (($(free_mb) >= needed)); }

enough && exit 0
echo "disk: $(free_mb) MB free, $what needs $needed MB: removing caches only building needed" >&2
for path in "$EBBFLOW_CACHE/wheelhouse" "$EBBFLOW_CACHE/go/build" "$EBBFLOW_CACHE/go/mod" \
  "$EBBFLOW_CACHE/fake-gpu-plugin/go-test"; do
  enough && exit 0
  [[ -e $path ]] || continue
  size=$(du -sm "$path" | cut -f1)
  chmod -R u+w "$path" # Go's module cache is read-only
  rm -rf "$path"
  echo "made room for $what: removed $path ($size MB)" # stdout: the caller shows it
done
enough && exit 0
echo "not enough disk for $what: $(free_mb) MB free where Docker keeps its data ($docker_root)," \
  "$needed MB needed. Free some (see \`docker system df\`; \`go clean -cache -modcache\` for your own" \
  "Go caches) and run again." >&2
exit 1
