#!/usr/bin/env bash
# Builds the project's container images on this machine, without a registry, in order:
#   ebbflow/python    Debian bookworm's Python 3.11 (hack/images/python-base.Dockerfile) on the
#                     debootstrapped root image from hack/images/debian-base.sh
#   ebbflow/operator  operator/Dockerfile on ebbflow/python
#   ebbflow/trainer   trainer-image/Dockerfile on ebbflow/python: `<version>` is the CUDA torch image
#                     (runs on GPUs and CPUs), `<version>-cpu` the CPU-only variant (kind nodes)
# Each is tagged ebbflow/<name>:<version> and :dev (:dev-cpu), where <version> hashes the image's
# inputs (its Dockerfile, the sources it copies, the pins, the base image), so an image whose tag
# exists is not rebuilt: builds are cached per machine and redone when an input changes.
#
# Why this way: no registry means no python:3.11-slim, no BuildKit frontend (docker 20.10's daemon
# with a docker 28 client and no buildx leaves only the classic builder, which has no cache mounts),
# so the Python wheels come from a per-machine wheelhouse (hack/images/wheelhouse.sh) served to the
# builds over HTTP on 127.0.0.1, and torch is downloaded once, not per build. See docs/images.md.
#
# Usage: hack/images/build-images.sh [base|operator|trainer|all]...   (default: all)
# Environment:
#   TRAINER_VARIANTS  "cuda cpu" (default), "cuda" or "cpu"
#   KEEP_BUILD_STAGES 1: keep the build stages' images as builder cache (trainer: about 6 GB) so a
#                     change to examples/ alone rebuilds in seconds; default 0 removes them
#   KEEP_OLD          1: keep images of superseded versions; default 0 removes them (disk)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
TRAINER_VARIANTS=${TRAINER_VARIANTS:-cuda cpu}
KEEP_BUILD_STAGES=${KEEP_BUILD_STAGES:-0}
KEEP_OLD=${KEEP_OLD:-0}
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(all)
for t in "${targets[@]}"; do
  case $t in
    base | operator | trainer | all) ;;
    *)
      echo "usage: $0 [base|operator|trainer|all]..." >&2
      exit 2
      ;;
  esac
done
wanted() { # wanted NAME: was NAME asked for (directly or through all)?
  local t
  for t in "${targets[@]}"; do [[ $t == "$1" || $t == all ]] && return 0; done
  return 1
}

log() { printf '%s build-images: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# hash_inputs FILE_OR_DIR... : one hash over the names and contents of the files a build copies
# (leaving out what .dockerignore leaves out: bytecode, egg-info, examples/jobs), plus any literal
# strings given after `--` (base image ids).
hash_inputs() {
  local paths=() extra=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    paths+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift && extra=("$@")
  {
    find "${paths[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' \
      ! -path 'examples/jobs/*' -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum
    printf '%s\n' "${extra[@]}"
  } | sha256sum | cut -c1-12
}

image_size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }

# Removes older versions of an image this script built (label dev.ebbflow.image=NAME).
remove_superseded() { # NAME CURRENT_VERSION
  [[ $KEEP_OLD == 1 ]] && return 0
  local id version
  docker images --filter "label=dev.ebbflow.image=$1" --format '{{.ID}}' | sort -u | while read -r id; do
    version=$(docker image inspect -f '{{index .Config.Labels "dev.ebbflow.version"}}' "$id")
    if [[ $version != "$2" ]]; then
      log "removing superseded ebbflow/$1 $version ($id)"
      docker rmi --force "$id" >/dev/null || log "could not remove $id (in use?); left in place"
    fi
  done
}

# The wheelhouse HTTP server, started on first need and stopped on exit.
WHEELS_URL=""
SERVER_PID=""
cleanup() { [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT
serve_wheelhouse() {
  [[ -n $WHEELS_URL ]] && return 0
  local wheelhouse port
  wheelhouse=$(bash hack/images/wheelhouse.sh) || die "filling the wheelhouse failed"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m http.server "$port" --bind 127.0.0.1 --directory "$wheelhouse" >/dev/null 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 50); do
    if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/')" 2>/dev/null; then
      WHEELS_URL="http://127.0.0.1:$port/"
      log "serving the wheelhouse $wheelhouse at $WHEELS_URL"
      return 0
    fi
    sleep 0.2
  done
  die "the wheelhouse HTTP server did not start on port $port"
}

# build NAME VERSION DOCKERFILE TARGET TAG [docker build args...]: one docker build, timed.
build() {
  local name=$1 version=$2 dockerfile=$3 target=$4 tag=$5
  shift 5
  local start=$SECONDS
  local logfile
  logfile=$(mktemp "${TMPDIR:-/tmp}/ebbflow-build-$name.XXXXXX")
  log "building $tag (log: $logfile)"
  # --network host: the build's RUN steps reach the wheelhouse server on 127.0.0.1.
  if ! docker build --network host --force-rm -f "$dockerfile" ${target:+--target "$target"} \
    --label "dev.ebbflow.image=$name" --label "dev.ebbflow.version=$version" \
    -t "$tag" "$@" >"$logfile" 2>&1; then
    tail -40 "$logfile" >&2
    die "docker build of $tag failed; full log: $logfile"
  fi
  rm -f "$logfile"
  log "built $tag in $((SECONDS - start)) s, $(image_size "$tag")"
}

bash hack/images/docker-daemon.sh

# --- base ------------------------------------------------------------------------------------------
DEBIAN_IMAGE=$(bash hack/images/debian-base.sh) || die "hack/images/debian-base.sh failed"
debian_id=$(docker image inspect -f '{{.Id}}' "$DEBIAN_IMAGE")
base_version=$(hash_inputs hack/images/python-base.Dockerfile -- "$debian_id")
BASE=ebbflow/python:$base_version
if docker image inspect "$BASE" >/dev/null 2>&1; then
  log "$BASE exists ($(image_size "$BASE"))"
elif wanted base || wanted operator || wanted trainer; then
  # No build context: the base copies nothing.
  start=$SECONDS
  docker build --force-rm --build-arg "DEBIAN=$DEBIAN_IMAGE" --label dev.ebbflow.image=python \
    --label "dev.ebbflow.version=$base_version" -t "$BASE" - <hack/images/python-base.Dockerfile \
    >/dev/null || die "building $BASE failed (rerun: docker build - <hack/images/python-base.Dockerfile)"
  log "built $BASE in $((SECONDS - start)) s, $(image_size "$BASE")"
fi
docker tag "$BASE" ebbflow/python:dev
base_id=$(docker image inspect -f '{{.Id}}' "$BASE")

# --- operator --------------------------------------------------------------------------------------
if wanted operator; then
  version=$(hash_inputs operator/Dockerfile .dockerignore hack/images/constraints.txt api operator \
    -- "$base_id")
  tag=ebbflow/operator:$version
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag exists ($(image_size "$tag"))"
  else
    serve_wheelhouse
    args=(--build-arg "BASE=$BASE" --build-arg "WHEELS=$WHEELS_URL" .)
    build operator "$version" operator/Dockerfile build "ebbflow/operator-build:$version" "${args[@]}"
    build operator "$version" operator/Dockerfile "" "$tag" "${args[@]}"
    [[ $KEEP_BUILD_STAGES == 1 ]] || docker rmi "ebbflow/operator-build:$version" >/dev/null
  fi
  docker tag "$tag" ebbflow/operator:dev
  remove_superseded operator "$version"
fi

# --- trainer ---------------------------------------------------------------------------------------
if wanted trainer; then
  version=$(hash_inputs trainer-image/Dockerfile .dockerignore hack/images/constraints.txt api \
    trainer-image examples -- "$base_id")
  need=()
  for variant in $TRAINER_VARIANTS; do
    case $variant in
      cuda) tag=ebbflow/trainer:$version ;;
      cpu) tag=ebbflow/trainer:$version-cpu ;;
      *) die "TRAINER_VARIANTS: unknown variant $variant (cuda, cpu)" ;;
    esac
    if docker image inspect "$tag" >/dev/null 2>&1; then
      log "$tag exists ($(image_size "$tag"))"
    else
      need+=("$variant")
    fi
  done
  if [[ ${#need[@]} -gt 0 ]]; then
    serve_wheelhouse
    args=(--build-arg "BASE=$BASE" --build-arg "WHEELS=$WHEELS_URL" .)
    # The build stage first, tagged, so it can be removed afterwards (about 6 GB); the variants reuse it.
    build trainer "$version" trainer-image/Dockerfile build "ebbflow/trainer-build:$version" "${args[@]}"
    for variant in "${need[@]}"; do
      if [[ $variant == cpu ]]; then
        build trainer "$version" trainer-image/Dockerfile cpu "ebbflow/trainer:$version-cpu" "${args[@]}"
      else
        build trainer "$version" trainer-image/Dockerfile "" "ebbflow/trainer:$version" "${args[@]}"
      fi
    done
    [[ $KEEP_BUILD_STAGES == 1 ]] || docker rmi "ebbflow/trainer-build:$version" >/dev/null
  fi
  for variant in $TRAINER_VARIANTS; do
    if [[ $variant == cpu ]]; then
      docker tag "ebbflow/trainer:$version-cpu" ebbflow/trainer:dev-cpu
    else
      docker tag "ebbflow/trainer:$version" ebbflow/trainer:dev
    fi
  done
  remove_superseded trainer "$version"
fi

# Last: an older base cannot be removed while images built on it exist.
remove_superseded python "$base_version"

log "images:"
docker images --filter 'label=dev.ebbflow.image' --format '  {{.Repository}}:{{.Tag}}\t{{.Size}}' |
  grep -v -e '-build:' -e '<none>' | sort >&2
