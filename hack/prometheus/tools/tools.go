//go:build tools

// Package tools pins Prometheus for hack/prometheus (hack/build-tools.sh prometheus), and the
// go-yaml v4 release that stands in for github.com/pb33f/go-yaml (see go.mod).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "go.yaml.in/yaml/v4"
)
