//go:build tools

// Package tools pins Cilium for hack/cilium (hack/build-tools.sh cilium): the agent and what its
// DaemonSet's init containers run, and the CNI plugin.
package tools

import (
	_ "github.com/cilium/cilium/cilium-dbg"
	_ "github.com/cilium/cilium/daemon"
	_ "github.com/cilium/cilium/plugins/cilium-cni"
	_ "github.com/cilium/cilium/tools/mount"
	_ "github.com/cilium/cilium/tools/sysctlfix"
)
