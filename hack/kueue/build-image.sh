#!/usr/bin/env bash
# Builds Kueue's manager image without a registry, from the binary of `hack/build-tools.sh kueue`
# (the pinned sigs.k8s.io/kueue, see hack/tools/kueue/go.mod): ebbflow/kueue:<hash>, /manager (where
# Kueue's release Deployment runs it) and nothing else (hack/images/import-binary.sh).
# Prints the tag, then the directory of the module's config/ tree (its kustomization), one per line.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

bash "$ROOT/hack/build-tools.sh" kueue >&2
bash "$ROOT/hack/images/import-binary.sh" kueue /manager ebbflow/kueue "$HERE/build-image.sh"
echo "$ROOT/.tools/kueue/config"
