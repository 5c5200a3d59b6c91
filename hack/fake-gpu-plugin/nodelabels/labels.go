// Package nodelabels puts on the node the labels NVIDIA's GPU feature discovery (GFD) sets,
// which Ebbflow's operator reads to know a node's GPUs and how they are shared.
package nodelabels

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strconv"
	"strings"
	"time"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Label keys, as GFD spells them.
const (
	Product         = "nvidia.com/gpu.product"
	Count           = "nvidia.com/gpu.count"
	Replicas        = "nvidia.com/gpu.replicas"
	SharingStrategy = "nvidia.com/gpu.sharing-strategy"
	Memory          = "nvidia.com/gpu.memory" // MiB of one physical GPU
)

// For computes the labels for a node with these settings. Like GFD: the count is physical
// GPUs; a time-sliced GPU whose resource keeps its name gets "-SHARED" appended to the
// product, so a pod selecting the product does not land on shared GPUs by accident.
func For(s config.Settings) map[string]string {
	product := strings.ReplaceAll(s.Product, " ", "-")
	strategy := "none"
	if s.TimeSliced() {
		strategy = "time-slicing"
		if !s.Renamed {
			product += "-SHARED"
		}
	}
	labels := map[string]string{
		Product:         product,
		Count:           strconv.Itoa(s.GPUCount),
		Replicas:        strconv.Itoa(s.Replicas),
		SharingStrategy: strategy,
	}
	if s.MemoryMiB > 0 {
		labels[Memory] = strconv.Itoa(s.MemoryMiB)
	}
	return labels
}

// Apply merges the labels into the node's labels (other labels are left alone).
func Apply(ctx context.Context, nodes corev1client.NodeInterface, nodeName string, labels map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if _, err := nodes.Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", nodeName, err)
	}
	return nil
}

// Keeper keeps the node labelled: it applies the labels at once, retries failures with capped
// exponential backoff, and re-applies every Interval, as GFD relabels every minute, so a
// Node object that was deleted and re-registered gets its labels back. Failing to label never
// stops the plugin: the kubelet still gets the devices.
type Keeper struct {
	Nodes      corev1client.NodeInterface
	NodeName   string
	Labels     map[string]string
	Interval   time.Duration // between successful applies
	FirstRetry time.Duration // first backoff after a failure; doubles up to Interval
}

// Run labels until ctx ends.
func (k Keeper) Run(ctx context.Context) {
	wait, healthy := time.Duration(0), false
	for sleep(ctx, wait) {
		err := Apply(ctx, k.Nodes, k.NodeName, k.Labels)
		switch {
		case err != nil:
			wait = k.backoff(wait, healthy)
			healthy = false
			log.Printf("%v; retrying in %s", err, wait)
		case !healthy:
			log.Printf("labelled node %s: %v", k.NodeName, k.Labels)
			wait, healthy = k.Interval, true
		default:
			wait = k.Interval
		}
	}
}

// backoff is the wait after a failure: FirstRetry after a success, then doubling.
func (k Keeper) backoff(previous time.Duration, wasHealthy bool) time.Duration {
	if wasHealthy || previous < k.FirstRetry {
		return k.FirstRetry
	}
	return min(2*previous, k.Interval)
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
