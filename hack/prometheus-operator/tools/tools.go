//go:build tools

// Package tools pins the Prometheus Operator and its config reloader for hack/prometheus-operator
// (hack/build-tools.sh prometheus-operator).
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
