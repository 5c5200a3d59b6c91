//go:build tools

// Package tools pins the Kubernetes node commands built for the kind node image
// (hack/build-tools.sh kubernetes-node). A sibling of ../kubernetes because the kubelet
// pulls modules the control-plane wrapper does not need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
