//go:build tools

// Package tools pins Kubeflow's training-operator for hack/kubeflow (hack/build-tools.sh
// training-operator): the manager command, which runs the PyTorchJob controller.
package tools

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
