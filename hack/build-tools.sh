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

# module_version GO_MOD MODULE: the version GO_MOD requires of MODULE (one-line or block require).
module_version() {
  awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 != "=>" {print $2; exit}' "$1"
}
# One module graph (hack/tools/kubernetes) pins the Kubernetes commands and the tools whose Kubernetes
# libraries are the same minor release: one version of each shared module, so a package compiled for
# one command is a build-cache hit for the next (build_in_kube_graph). Its commands are cached under
# their version and the graph's go.sum digest: a change to the graph builds them again.
KUBE_GRAPH=$ROOT/hack/tools/kubernetes
# module_digest DIR: 12 hex digits of a wrapper module's go.sum and Go sources, for cache keys.
module_digest() { cat "$1/go.sum" "$1"/*.go | sha256sum | cut -c1-12; }
KUBE_GRAPH_DIGEST=$(module_digest "$KUBE_GRAPH")
KUBERNETES_VERSION=$(module_version "$KUBE_GRAPH/go.mod" k8s.io/kubernetes)
KWOK_VERSION=$(module_version "$KUBE_GRAPH/go.mod" sigs.k8s.io/kwok)
HELM_VERSION=$(module_version "$KUBE_GRAPH/go.mod" helm.sh/helm/v3)
CRICTL_VERSION=$(module_version "$KUBE_GRAPH/go.mod" sigs.k8s.io/cri-tools)
LOCAL_PATH_VERSION=$(module_version "$KUBE_GRAPH/go.mod" github.com/rancher/local-path-provisioner)
ETCD_VERSION=$(module_version "$ROOT/hack/tools/etcd/go.mod" go.etcd.io/etcd/server/v3)
KIND_VERSION=v0.32.0
# For the kind node image (hack/kind/): not part of the default set. (CoreDNS: its wrapper module
# hack/tools/coredns requires the same version; build_coredns checks.)
COREDNS_VERSION=v1.15.0
FLANNEL_VERSION=v0.28.10
CNI_PLUGINS_VERSION=v1.9.1
# Prometheus 3.16.0 (Go module version v0.316.0) for hack/prometheus/: not part of the default set.
PROMETHEUS_VERSION=$(awk '$1 == "github.com/prometheus/prometheus" {print $2; exit}' "$ROOT/hack/prometheus/tools/go.mod")
# kube-router's NetworkPolicy controller for hack/kube-router/ (NetworkPolicy in the kind cluster): not in the default set.
KUBE_ROUTER_VERSION=$(awk '$1 == "require" && $2 == "github.com/cloudnativelabs/kube-router/v2" {print $3}' "$ROOT/hack/kube-router/tools/go.mod")
# The Prometheus Operator and its config reloader for hack/prometheus-operator/ (e2e tier, demo): not in the default set.
PROMETHEUS_OPERATOR_VERSION=$(awk '$1 == "require" && $2 == "github.com/prometheus-operator/prometheus-operator" {print $3}' "$ROOT/hack/prometheus-operator/tools/go.mod")
# Kubeflow's training-operator for hack/kubeflow/ (the PyTorchJob baseline of the benchmark): not in the default set.
TRAINING_OPERATOR_VERSION=$(awk '$1 == "require" && $2 == "github.com/kubeflow/training-operator" {print $3}' "$ROOT/hack/kubeflow/tools/go.mod")

# SeaweedFS's S3 gateway (`weed`) for the object-store checkpoints' tests: not in the default set.
SEAWEEDFS_VERSION=$(module_version "$ROOT/hack/tools/seaweedfs/go.mod" github.com/seaweedfs/seaweedfs)

# Every Go build here compiles without DWARF: the links strip it (-s -w) anyway, and the compiler spent
# about an eighth of its time generating it (docs/ci.md, "Cheaper tool builds"). GOFLAGS carries it, so
# the Kubernetes graph's commands and the fake GPU plugin (hack/fake-gpu-plugin) keep sharing packages.
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false"
# The tools whose speed no test depends on (the kind nodes' add-ons, Prometheus and its operator, Kueue,
# SeaweedFS, kind's CLI) are also compiled without optimisation or inlining (-N -l): about a fifth less
# compile time. The Kubernetes graph and etcd, which every tier's API server runs on, stay optimised.
UNOPTIMISED=(-gcflags "all=-dwarf=false -N -l")
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
  local flags="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# build_in_kube_graph NAME VERSION PACKAGE [LDFLAGS]: one command of the Kubernetes graph. The tags are
# the Kubernetes release's, for every command of the graph: the same flags make the same packages.
build_in_kube_graph() {
  local name=$1 version=$2-$KUBE_GRAPH_DIGEST pkg=$3 ldflags="-s -w ${4:-}"
  local dir=$TOOLS_CACHE/$name-$version
  if ! cached "$name" "$version"; then
    echo "building $name $2 (Kubernetes graph $KUBE_GRAPH_DIGEST: minutes for its first command on a machine, less for the next)"
    mkdir -p "$dir"
    (cd "$KUBE_GRAPH" && go build -trimpath -tags selinux,notest -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg")
    mv -f "$dir/$name.tmp" "$dir/$name"
  fi
  install_from_cache "$name" "$version"
}

# build_kubernetes NAME...: commands from k8s.io/kubernetes/cmd, with the release's version stamped.
build_kubernetes() {
  local name
  for name in "$@"; do
    build_in_kube_graph "$name" "$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/$name" "$(kubernetes_ldflags)"
  done
}

# build_helm: stamped as Helm's own Makefile does (its version; the Kubernetes release its charts'
# capabilities default to).
build_helm() {
  local minor=${KUBERNETES_VERSION#v1.} flags="" pkg
  minor=${minor%%.*}
  flags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  build_in_kube_graph helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$flags"
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
    GOBIN=$dir go install -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w" "$pkg@$version"
  fi
  install_from_cache "$name" "$version"
}

# build_coredns: CoreDNS with the plugins the kind cluster's Corefile uses, from the wrapper module
# hack/tools/coredns (its main.go lists them), cached under its version and the module's digest.
build_coredns() {
  local module=$ROOT/hack/tools/coredns required
  local version=$COREDNS_VERSION-$(module_digest "$module") dir
  dir=$TOOLS_CACHE/coredns-$version
  required=$(module_version "$module/go.mod" github.com/coredns/coredns)
  if [[ $required != "$COREDNS_VERSION" ]]; then
    echo "hack/tools/coredns/go.mod requires CoreDNS $required, COREDNS_VERSION above says $COREDNS_VERSION: make them equal" >&2
    return 1
  fi
  if ! cached coredns "$version"; then
    echo "building coredns $COREDNS_VERSION"
    mkdir -p "$dir"
    (cd "$module" && go build -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$dir/coredns.tmp" .)
    mv -f "$dir/coredns.tmp" "$dir/coredns"
  fi
  install_from_cache coredns "$version"
}

# build_flannel: flanneld without the tencentvpc and udp backends (see hack/tools/flannel/go.mod).
build_flannel() {
  local dir=$TOOLS_CACHE/flannel-$FLANNEL_VERSION work src
  if ! cached flannel "$FLANNEL_VERSION"; then
    echo "building flannel $FLANNEL_VERSION"
    mkdir -p "$dir"
    work=$(mktemp -d)
    cp "$ROOT/hack/tools/flannel/go.mod" "$ROOT/hack/tools/flannel/go.sum" "$work/"
    src=$(cd "$work" && go mod download -json "github.com/flannel-io/flannel@$FLANNEL_VERSION" |
      awk -F'"' '$2 == "Dir" {print $4}')
    sed -e '/flannel\/pkg\/backend\/tencentvpc"/d' -e '/flannel\/pkg\/backend\/udp"/d' "$src/main.go" >"$work/main.go"
    (cd "$work" && go build -trimpath "${UNOPTIMISED[@]}" \
      -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" -o "$dir/flannel.tmp" .)
    rm -rf "$work"
    mv -f "$dir/flannel.tmp" "$dir/flannel"
  fi
  install_from_cache flannel "$FLANNEL_VERSION"
}

# build_cni_plugins: the CNI plugins the kind node image needs, into $TOOLS_BIN/cni/.
build_cni_plugins() {
  local dir=$TOOLS_CACHE/cni-plugins-$CNI_PLUGINS_VERSION p pkgs=() m=github.com/containernetworking/plugins/plugins
  local plugins=(main/bridge main/loopback main/ptp ipam/host-local meta/portmap meta/bandwidth)
  if [[ ! -x $dir/bandwidth ]]; then
    echo "building cni-plugins $CNI_PLUGINS_VERSION"
    mkdir -p "$dir"
    for p in "${plugins[@]}"; do pkgs+=("$m/$p@$CNI_PLUGINS_VERSION"); done
    GOBIN=$dir go install -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w" "${pkgs[@]}"
  fi
  mkdir -p "$TOOLS_BIN/cni"
  for p in "${plugins[@]}"; do cp -f "$dir/${p#*/}" "$TOOLS_BIN/cni/"; done
  echo "  cni-plugins $CNI_PLUGINS_VERSION"
}

# build_prometheus: prometheus and promtool for hack/prometheus/, in the wrapper module hack/prometheus/tools
# (its go.mod says why a wrapper: the proxy refuses three of the versions Prometheus requires). Built like
# build_flannel, in a scratch copy of the module holding ./go-yaml: go.yaml.in/yaml/v4 under the path
# github.com/pb33f/go-yaml. Tags: remove_all_sd,enable_kubernetes_sd keep only the file, http and
# kubernetes service discovery (no cloud ones); not builtinassets, which embeds the web UI (its assets are
# not in the module zip: the build would fail), so UI pages answer 500; the HTTP API is all we use.
build_prometheus() {
  local dir=$TOOLS_CACHE/prometheus-$PROMETHEUS_VERSION v=${PROMETHEUS_VERSION#v0.} work src ldflags
  local pkg=github.com/prometheus/common/version m=github.com/prometheus/prometheus/cmd
  v=${v:0:1}.${v:1} # the release: v0.316.0 -> 3.16.0
  if ! cached prometheus "$PROMETHEUS_VERSION" || [[ ! -x $dir/promtool ]]; then
    echo "building prometheus $PROMETHEUS_VERSION (Prometheus $v; first time on this machine: several minutes)"
    mkdir -p "$dir"
    work=$(mktemp -d)
    cp "$ROOT/hack/prometheus/tools/go.mod" "$ROOT/hack/prometheus/tools/go.sum" "$work/"
    src=$(cd "$work" && go mod download -json go.yaml.in/yaml/v4 | awk -F'"' '$2 == "Dir" {print $4}')
    cp -R "$src" "$work/go-yaml"
    chmod -R u+w "$work/go-yaml"
    grep -rlZ --include='*.go' --include=go.mod go.yaml.in/yaml/v4 "$work/go-yaml" |
      xargs -0 sed -i 's#go\.yaml\.in/yaml/v4#github.com/pb33f/go-yaml#g'
    ldflags="-s -w -X $pkg.Version=$v -X $pkg.Revision=$PROMETHEUS_VERSION -X $pkg.Branch=HEAD"
    ldflags+=" -X $pkg.BuildUser=ebbflow -X $pkg.BuildDate=19700101-00:00:00"
    (cd "$work" && go build -trimpath "${UNOPTIMISED[@]}" -tags remove_all_sd,enable_kubernetes_sd -ldflags "$ldflags" \
      -o "$work/bin/" "$m/prometheus" "$m/promtool")
    mv -f "$work/bin/promtool" "$dir/promtool"
    mv -f "$work/bin/prometheus" "$dir/prometheus"
    rm -rf "$work"
  fi
  install_from_cache prometheus "$PROMETHEUS_VERSION"
  cp -f "$dir/promtool" "$TOOLS_BIN/promtool.tmp" && mv -f "$TOOLS_BIN/promtool.tmp" "$TOOLS_BIN/promtool"
}

# build_kube_router: kube-router (its NetworkPolicy controller is all hack/kube-router runs), in the
# wrapper module hack/kube-router/tools.
build_kube_router() {
  local dir=$TOOLS_CACHE/kube-router-$KUBE_ROUTER_VERSION
  if ! cached kube-router "$KUBE_ROUTER_VERSION"; then
    echo "building kube-router $KUBE_ROUTER_VERSION (first time on this machine: a few minutes)"
    mkdir -p "$dir"
    local pkg=github.com/cloudnativelabs/kube-router/v2/pkg/version
    (cd "$ROOT/hack/kube-router/tools" &&
      go build -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w -X $pkg.Version=$KUBE_ROUTER_VERSION -X $pkg.BuildDate=1970-01-01T00:00:00Z" \
        -o "$dir/kube-router.tmp" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
    mv -f "$dir/kube-router.tmp" "$dir/kube-router"
  fi
  echo "  kube-router $KUBE_ROUTER_VERSION (in $dir)"
}

# build_prometheus_operator: the Prometheus Operator and its config reloader, in the wrapper module
# hack/prometheus-operator/tools, with the module's CRDs copied beside them (crds/): the module cache
# may be emptied after the build (CI frees its disk), the cache of built tools is kept.
build_prometheus_operator() {
  local dir=$TOOLS_CACHE/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION
  if ! cached prometheus-operator "$PROMETHEUS_OPERATOR_VERSION"; then
    echo "building prometheus-operator $PROMETHEUS_OPERATOR_VERSION (first time on this machine: a few minutes)"
    mkdir -p "$dir/crds"
    local module=github.com/prometheus-operator/prometheus-operator source
    local pkg=github.com/prometheus/common/version
    local ldflags="-s -w -X $pkg.Version=${PROMETHEUS_OPERATOR_VERSION#v} -X $pkg.Revision=release -X $pkg.Branch=release"
    (cd "$ROOT/hack/prometheus-operator/tools" &&
      go build -trimpath "${UNOPTIMISED[@]}" -ldflags "$ldflags" -o "$dir/prometheus-config-reloader" "$module/cmd/prometheus-config-reloader" &&
      go build -trimpath "${UNOPTIMISED[@]}" -ldflags "$ldflags" -o "$dir/prometheus-operator.tmp" "$module/cmd/operator")
    source=$(cd "$ROOT/hack/prometheus-operator/tools" && go mod download -json "$module" | awk -F'"' '$2 == "Dir" {print $4}')
    install -m 0644 "$source"/example/prometheus-operator-crd/*.yaml "$dir/crds/"
    mv -f "$dir/prometheus-operator.tmp" "$dir/prometheus-operator"
  fi
  echo "  prometheus-operator $PROMETHEUS_OPERATOR_VERSION (in $dir)"
}

# build_training_operator: the manager of Kubeflow's training-operator (cmd/training-operator.v1), in the
# wrapper module hack/kubeflow/tools. Its CRDs and RBAC come from the module's manifests/ directory, printed
# by `build-tools.sh training-operator-source`.
build_training_operator() {
  local dir=$TOOLS_CACHE/training-operator-$TRAINING_OPERATOR_VERSION
  if ! cached training-operator "$TRAINING_OPERATOR_VERSION"; then
    echo "building training-operator $TRAINING_OPERATOR_VERSION (first time on this machine: a few minutes)"
    mkdir -p "$dir"
    (cd "$ROOT/hack/kubeflow/tools" && go build -trimpath -ldflags "-s -w" -o "$dir/training-operator.tmp" \
      github.com/kubeflow/training-operator/cmd/training-operator.v1)
    mv -f "$dir/training-operator.tmp" "$dir/training-operator"
  fi
  echo "  training-operator $TRAINING_OPERATOR_VERSION (in $dir)"
}

# build_kueue: Kueue's manager from the wrapper module hack/tools/kueue (main.go copied from the module
# cache with the changes its go.mod states), cached under the version and the module's digest; the
# module's config/ tree (its CRDs, webhook configurations and the kustomization of its release
# install) copied to $TOOLS_BIN/../kueue/config for the integration tier and the kind cluster.
build_kueue() {
  local module=$ROOT/hack/tools/kueue version src work
  version=$(module_version "$module/go.mod" sigs.k8s.io/kueue)
  local dir=$TOOLS_CACHE/kueue-$version-$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
  if [[ ! -x $dir/kueue || ! -d $dir/config ]]; then
    work=$(mktemp -d)
    cp "$module/go.mod" "$module/go.sum" "$work/"
    src=$(cd "$work" && go mod download -json "sigs.k8s.io/kueue@$version" | awk -F'"' '$2 == "Dir" {print $4}')
    if [[ ! -x $dir/kueue ]]; then
      echo "building kueue $version"
      mkdir -p "$dir"
      sed -e 's|_ "sigs.k8s.io/kueue/pkg/controller/jobs"$|_ "sigs.k8s.io/kueue/pkg/controller/jobs/job"|' \
        -e 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := func() string { if dir := os.Getenv("KUEUE_METRICS_CERT_DIR"); dir != "" { return dir }; return "/etc/kueue/metrics/certs" }()|' \
        "$src/cmd/kueue/main.go" >"$work/main.go"
      grep -q KUEUE_METRICS_CERT_DIR "$work/main.go" # the line changed upstream: update the sed
      (cd "$work" && go build -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
        -o "$dir/kueue.tmp" .)
      mv -f "$dir/kueue.tmp" "$dir/kueue"
    fi
    rm -rf "$dir/config.tmp" && cp -r "$src/config" "$dir/config.tmp"
    chmod -R u+w "$dir/config.tmp" && mv "$dir/config.tmp" "$dir/config" # the module cache is read-only
    rm -rf "$work"
  fi
  rm -rf "$TOOLS_BIN/../kueue" && mkdir -p "$TOOLS_BIN/../kueue"
  cp -r "$dir/config" "$TOOLS_BIN/../kueue/config"
  cp -f "$dir/kueue" "$TOOLS_BIN/kueue.tmp" && mv -f "$TOOLS_BIN/kueue.tmp" "$TOOLS_BIN/kueue"
  echo "  kueue $version"
}

# build_seaweedfs: `weed` from the SeaweedFS module's own directory and go.mod (its release build;
# module verified by hack/tools/seaweedfs/go.sum), cached under its version.
build_seaweedfs() {
  local dir=$TOOLS_CACHE/weed-$SEAWEEDFS_VERSION src
  if ! cached weed "$SEAWEEDFS_VERSION"; then
    echo "building weed (SeaweedFS) $SEAWEEDFS_VERSION"
    mkdir -p "$dir"
    src=$(cd "$ROOT/hack/tools/seaweedfs" && go mod download -json "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" |
      awk -F'"' '$2 == "Dir" {print $4}')
    (cd "$src" && GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath "${UNOPTIMISED[@]}" -ldflags "-s -w" -o "$dir/weed.tmp" ./weed)
    mv -f "$dir/weed.tmp" "$dir/weed"
  fi
  install_from_cache weed "$SEAWEEDFS_VERSION"
}

# build TOOL: one tool (cached: a copy), its build time appended to $EBBFLOW_TIMINGS when it was built.
build() {
  local tool=$1 started=$SECONDS
  case $tool in
    kubernetes) build_kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl ;;
    # Node-side commands for the kind node image (hack/kind/build-node-image.sh); not in the default set.
    kubernetes-node) build_kubernetes kubelet kubeadm kube-proxy ;;
    etcd) build_etcd ;;
    kwok) build_in_kube_graph kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok ;;
    helm) build_helm ;;
    kind) build_module kind sigs.k8s.io/kind "$KIND_VERSION" ;;
    coredns) build_coredns ;;
    flannel) build_flannel ;;
    crictl) build_in_kube_graph crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" ;;
    cni-plugins) build_cni_plugins ;;
    local-path-provisioner) build_in_kube_graph local-path-provisioner "$LOCAL_PATH_VERSION" github.com/rancher/local-path-provisioner ;;
    # Prometheus and promtool for hack/prometheus/ (e2e tier, demo); not in the default set.
    prometheus) build_prometheus ;;
    # kube-router for hack/kube-router/ (NetworkPolicy enforcement in the kind cluster); not in the default set.
    kube-router) build_kube_router ;;
    # The Prometheus Operator for hack/prometheus-operator/ (e2e tier, demo); not in the default set.
    prometheus-operator) build_prometheus_operator ;;
    # Kubeflow's training-operator for hack/kubeflow/ (benchmark baseline); not in the default set.
    training-operator) build_training_operator ;;
    # Kueue's manager and CRDs for the integration tier's Kueue tests (tests/integration/test_kueue.py).
    kueue) build_kueue ;;
    # SeaweedFS's `weed` for the object-store checkpoints' tests (trainer tier).
    seaweedfs) build_seaweedfs ;;
    training-operator-source) (cd "$ROOT/hack/kubeflow/tools" && go mod download -json github.com/kubeflow/training-operator | awk -F'"' '$2 == "Dir" {print $4}') ;;
    *) echo "unknown tool '$tool' (known: kubernetes etcd kwok helm kind kueue seaweedfs; for kind nodes: kubernetes-node coredns flannel crictl cni-plugins local-path-provisioner; other: prometheus prometheus-operator kube-router training-operator training-operator-source)" >&2; return 2 ;;
  esac
  if ((SECONDS - started > 2)) && [[ -n ${EBBFLOW_TIMINGS:-} ]]; then
    echo "  make tools, $tool built: $((SECONDS - started)) s" >>"$EBBFLOW_TIMINGS"
  fi
}

# build_in_order TOOL...: one after the other; under `set -e`, the first failure ends it (so never
# call it on the left of || or &&, where bash ignores `set -e` inside).
build_in_order() {
  local tool
  for tool in "$@"; do build "$tool"; done
}

# Two lanes when both have work, of about equal cold build time (docs/ci.md, "A fresh machine"): the
# Kubernetes graph's commands (which share most packages, so one after the other), then SeaweedFS;
# everything else beside them. A `go build` keeps up to two cores busy,
# but its links and long dependency chains are serial, so two lanes fill the cores where one leaves
# gaps; a warm machine copies the tools in seconds either way. The second lane's output comes after
# the first's, whole.
if (($#)); then want=("$@"); else want=(kubernetes etcd kwok helm kind prometheus kueue seaweedfs); fi
first_lane=() second_lane=()
for tool in "${want[@]}"; do
  case $tool in
    kubernetes | kubernetes-node | helm | kwok | crictl | local-path-provisioner | seaweedfs) first_lane+=("$tool") ;;
    *) second_lane+=("$tool") ;;
  esac
done
if ((${#first_lane[@]} == 0 || ${#second_lane[@]} == 0)); then
  build_in_order "${want[@]}"
  exit
fi
second_log=$(mktemp)
trap 'rm -f "$second_log"' EXIT
build_in_order "${second_lane[@]}" >"$second_log" 2>&1 &
second=$!
build_in_order "${first_lane[@]}" &
first=$!
status=0
wait "$first" || status=$?
wait "$second" || status=$((status ? status : $?))
cat "$second_log"
exit "$status"
