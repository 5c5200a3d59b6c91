#!/usr/bin/env bash
# Builds the pinned control-plane and packaging tools from the Go module proxy.
#
# Binaries land in $TOOLS_BIN (git-ignored, default .tools/bin). Each tool is built once
# per machine into $TOOLS_CACHE (default ~/.cache/ebbflow/tools/<tool>-<version>) and
# copied from there, so a fresh clone on a machine that built them before costs seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS_BIN=${TOOLS_BIN:-$ROOT/.tools/bin}
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}

KUBERNETES_VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$ROOT/hack/tools/kubernetes/go.mod")
ETCD_VERSION=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$ROOT/hack/tools/etcd/go.mod")
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4
KIND_VERSION=v0.32.0

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
mkdir -p "$TOOLS_BIN" "$TOOLS_CACHE"

# cached NAME VERSION: true when the tool is already built for this version.
cached() { [[ -x "$TOOLS_CACHE/$1-$2/$1" ]]; }

# install_from_cache NAME VERSION: copies a cached build into TOOLS_BIN.
install_from_cache() {
  cp -f "$TOOLS_CACHE/$1-$2/$1" "$TOOLS_BIN/$1.tmp" && mv -f "$TOOLS_BIN/$1.tmp" "$TOOLS_BIN/$1"
  echo "  $1 $2"
}

kubernetes_ldflags() {
  local v=$KUBERNETES_VERSION minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

build_kubernetes() {
  local name dir
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    dir=$TOOLS_CACHE/$name-$KUBERNETES_VERSION
    if ! cached "$name" "$KUBERNETES_VERSION"; then
      echo "building $name $KUBERNETES_VERSION (first time on this machine: several minutes)"
      mkdir -p "$dir"
      (cd "$ROOT/hack/tools/kubernetes" &&
        go build -trimpath -tags selinux,notest -ldflags "$(kubernetes_ldflags)" \
          -o "$dir/$name.tmp" "k8s.io/kubernetes/cmd/$name")
      mv -f "$dir/$name.tmp" "$dir/$name"
    fi
    install_from_cache "$name" "$KUBERNETES_VERSION"
  done
}

build_etcd() {
  local dir=$TOOLS_CACHE/etcd-$ETCD_VERSION
  if ! cached etcd "$ETCD_VERSION"; then
    echo "building etcd $ETCD_VERSION"
    mkdir -p "$dir"
    (cd "$ROOT/hack/tools/etcd" &&
      go build -trimpath -ldflags "-s -w" -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv -f "$dir/etcd.tmp" "$dir/etcd"
  fi
  install_from_cache etcd "$ETCD_VERSION"
}

# build_module NAME PACKAGE VERSION: `go install PACKAGE@VERSION` for modules without replaces.
build_module() {
  local name=$1 pkg=$2 version=$3 dir=$TOOLS_CACHE/$1-$3
  if ! cached "$name" "$version"; then
    echo "building $name $version"
    mkdir -p "$dir"
    GOBIN=$dir go install -trimpath -ldflags "-s -w" "$pkg@$version"
  fi
  install_from_cache "$name" "$version"
}

want=${*:-kubernetes etcd kwok helm kind}
for tool in $want; do
  case $tool in
    kubernetes) build_kubernetes ;;
    etcd) build_etcd ;;
    kwok) build_module kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" ;;
    helm) build_module helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
    kind) build_module kind sigs.k8s.io/kind "$KIND_VERSION" ;;
    *) echo "unknown tool '$tool' (known: kubernetes etcd kwok helm kind)" >&2; exit 2 ;;
  esac
done
