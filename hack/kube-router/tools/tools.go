//go:build tools

// Package tools pins kube-router for hack/kube-router (hack/build-tools.sh kube-router).
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
