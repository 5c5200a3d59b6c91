//go:build tools

// Package tools pins crictl for the kind node image (hack/build-tools.sh crictl). A wrapper
// module because `go install sigs.k8s.io/cri-tools/cmd/crictl@VERSION` asks the proxy for the
// module's version list, which it refuses for cri-tools.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
