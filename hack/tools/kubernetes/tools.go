//go:build tools

// Package tools pins every command built from this module's graph (hack/build-tools.sh): the
// Kubernetes control plane, node commands and kubectl, and the tools that build on its Kubernetes
// libraries (Helm, KWOK, crictl, and local-path-provisioner, whose own pins are older but raise
// none of this graph's). One graph means one version of each shared module, so a package compiled
// for one command is a build-cache hit for the next.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
