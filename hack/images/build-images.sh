#!/usr/bin/env bash
# Builds the project's container images on this machine, without a registry, in order:
#   ebbflow/python    Debian bookworm's Python 3.11 (hack/images/python-base.Dockerfile) on the
#                     debootstrapped root image from hack/images/debian-base.sh
#   ebbflow/operator  operator/Dockerfile on ebbflow/python
#   ebbflow/trainer   trainer-image/Dockerfile on ebbflow/python: `<version>` is the CUDA torch image
#                     (runs on GPUs and CPUs), `<version>-cpu` the CPU-only variant (kind nodes)
# Each is tagged ebbflow/<name>:<version> and :dev (:dev-cpu), where <version> hashes the image's
# inputs (its Dockerfile, the sources it copies, the pins, the base image), so an image whose tag
# exists is not rebuilt: builds are cached per machine and redone when an input changes. The images'
# third-party packages are a stage of their own (ebbflow/<name>-deps, kept as the builder's cache and
# keyed by the project files and pins only), so a source change reinstalls Ebbflow's packages alone.
#
# Why this way: no registry means no python:3.11-slim, no BuildKit frontend (docker 20.10's daemon
# with a docker 28 client and no buildx leaves only the classic builder, which has no cache mounts),
# so the Python wheels come from a per-machine wheelhouse (hack/images/wheelhouse.sh) served to the
# builds over HTTP on 127.0.0.1, and torch is downloaded once, not per build. See docs/images.md.
#
# Usage: hack/images/build-images.sh [base|operator|trainer|all]...   (default: all)
# Environment:
#   TRAINER_VARIANTS  "cuda cpu" (default), "cuda" or "cpu"
#   KEEP_OLD          1: keep images of superseded versions; default 0 removes them (disk)
#   WHEELHOUSE_PORT   the port on 127.0.0.1 the wheelhouse is served on during builds (default 38617)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
TRAINER_VARIANTS=${TRAINER_VARIANTS:-cuda cpu}
KEEP_OLD=${KEEP_OLD:-0}
WHEELHOUSE_PORT=${WHEELHOUSE_PORT:-38617}
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
  # One port every time: the URL is a build argument of the cached dependency stages, and another
  # value would miss their cache. A port in use costs that cache once (a free one is taken instead).
  port=$WHEELHOUSE_PORT
  # SO_REUSEADDR as http.server sets it: the last build's connections in TIME_WAIT do not count.
  if ! python3 -c "import socket as s; k = s.socket(); k.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1)
k.bind(('127.0.0.1', $port))" 2>/dev/null; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    log "port $WHEELHOUSE_PORT is in use: serving the wheelhouse on $port (the dependency stages rebuild)"
  fi
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

# build_deps NAME DOCKERFILE INPUTS...: the image's `deps` stage (its third-party packages, from the
# project files alone), tagged ebbflow/NAME-deps:<hash of INPUTS> and kept as the builder's cache, so
# that a change to the sources rebuilds only the layer of Ebbflow's own packages; superseded ones go.
build_deps() {
  local name=$1 dockerfile=$2 deps_version
  shift 2
  deps_version=$(hash_inputs "$dockerfile" .dockerignore hack/images/constraints.txt \
    hack/images/venv_layers.py "$@" -- "$base_id")
  if docker image inspect "ebbflow/$name-deps:$deps_version" >/dev/null 2>&1; then
    log "ebbflow/$name-deps:$deps_version exists ($(image_size "ebbflow/$name-deps:$deps_version"))"
  else
    build "$name-deps" "$deps_version" "$dockerfile" deps "ebbflow/$name-deps:$deps_version" \
      --build-arg "BASE=$BASE" --build-arg "WHEELS=$WHEELS_URL" .
  fi
  remove_superseded "$name-deps" "$deps_version"
}

# --- operator --------------------------------------------------------------------------------------
if wanted operator; then
  version=$(hash_inputs operator/Dockerfile .dockerignore hack/images/constraints.txt \
    hack/images/venv_layers.py api operator -- "$base_id")
  tag=ebbflow/operator:$version
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag exists ($(image_size "$tag"))"
  else
    serve_wheelhouse
    build_deps operator operator/Dockerfile api/pyproject.toml operator/pyproject.toml
    build operator "$version" operator/Dockerfile "" "$tag" --build-arg "BASE=$BASE" \
      --build-arg "WHEELS=$WHEELS_URL" .
  fi
  docker tag "$tag" ebbflow/operator:dev
  remove_superseded operator "$version"
fi

# --- trainer ---------------------------------------------------------------------------------------
if wanted trainer; then
  version=$(hash_inputs trainer-image/Dockerfile .dockerignore hack/images/constraints.txt \
    hack/images/venv_layers.py api trainer-image examples -- "$base_id")
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
    build_deps trainer trainer-image/Dockerfile api/pyproject.toml trainer-image/pyproject.toml \
      trainer-image/cpu
    args=(--build-arg "BASE=$BASE" --build-arg "WHEELS=$WHEELS_URL" .)
    for variant in "${need[@]}"; do
      if [[ $variant == cpu ]]; then tag=ebbflow/trainer:$version-cpu; else tag=ebbflow/trainer:$version; fi
      build trainer "$version" trainer-image/Dockerfile "" "$tag" --build-arg "TORCH_VARIANT=$variant" "${args[@]}"
    done
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
# The builds' intermediate images nothing tagged refers to any more (superseded dependency stages:
# gigabytes each); the current ones stay, held by the ebbflow/*-deps tags and the images.
[[ $KEEP_OLD == 1 ]] || docker image prune --force --filter label=dev.ebbflow.image >/dev/null

log "images:"
docker images --filter 'label=dev.ebbflow.image' --format '  {{.Repository}}:{{.Tag}}\t{{.Size}}' |
  grep -v -e '<none>' | sort >&2
