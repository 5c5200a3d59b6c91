#!/usr/bin/env bash
# Builds SeaweedFS's image without a registry, from the `weed` of `hack/build-tools.sh seaweedfs`
# (the pinned module, see hack/tools/seaweedfs/go.mod): ebbflow/seaweedfs:<hash>, /weed and nothing
# else (hack/images/import-binary.sh). The e2e tier runs it as the cluster's object store
# (devtools/ebbflow_devtools/object_store.py). Prints the tag.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

bash "$ROOT/hack/build-tools.sh" seaweedfs >&2
bash "$ROOT/hack/images/import-binary.sh" weed /weed ebbflow/seaweedfs "$HERE/build-image.sh"
