#!/usr/bin/env bash
# Fills the per-machine wheelhouse the image builds install from, and prints its path.
#
# Why: torch and its nvidia-* libraries are about 4.5 GB of wheels. Docker 20.10's BuildKit cannot use
# `RUN --mount=type=cache` here (that needs the `# syntax` dockerfile frontend from a registry, and the
# docker 28 client has no buildx to drive BuildKit at all), so the classic builder would download them
# on every cold build. Instead every wheel every image needs (pinned by hack/images/constraints.txt)
# is downloaded once into $EBBFLOW_CACHE/wheelhouse, outside the repository, and build-images.sh
# serves it to `docker build` over HTTP on 127.0.0.1 (pip --no-index --find-links): no 4.5 GB build
# context, no wheel left in any image layer, and builds work offline once it is filled.
#
# Idempotent: skipped when the stamp matches the hash of the pyproject files and constraints (pip
# also skips wheels already present). Old versions stay until you `rm -rf` the folder.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EBBFLOW_CACHE=${EBBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow}
WHEELHOUSE=${WHEELHOUSE:-$EBBFLOW_CACHE/wheelhouse}
PYTHON=${PYTHON:-python3}
cd "$ROOT"

inputs=(hack/images/wheelhouse.sh hack/images/constraints.txt api/pyproject.toml operator/pyproject.toml
  trainer-image/pyproject.toml)
HASH=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
if [[ -f $WHEELHOUSE/.stamp && $(cat "$WHEELHOUSE/.stamp") == "$HASH" ]]; then
  echo "$WHEELHOUSE"
  exit 0
fi

# The images run Debian bookworm's CPython 3.11 on x86_64: the wheels must fit it, whatever runs this.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "wheelhouse.sh: needs Python 3.11 (the images' Python); set PYTHON=python3.11" >&2
  exit 1
fi
mkdir -p "$WHEELHOUSE"
echo "filling the wheelhouse $WHEELHOUSE (first time: about 5 GB from PyPI)" >&2
# Everything the three images install: the ebbflow distributions' dependencies (the trainer with its
# `hf` extra for examples/hf_lm) and the build backend pip needs to build the ebbflow sources.
# --no-cache-dir: the wheels are the cache; a second copy in pip's HTTP cache would double the disk.
"$PYTHON" -m pip download --quiet --no-cache-dir --only-binary=:all: --dest "$WHEELHOUSE" \
  --constraint hack/images/constraints.txt \
  ./api ./operator './trainer-image[hf]' setuptools wheel >&2
# pip download also saves the local sources as archives; the builds use the tree itself.
rm -f "$WHEELHOUSE"/ebbflow*
echo "$HASH" >"$WHEELHOUSE/.stamp"
echo "$WHEELHOUSE"
