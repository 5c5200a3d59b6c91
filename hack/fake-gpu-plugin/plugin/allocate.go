package plugin

import (
	"fmt"
	"slices"
	"strings"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Environment variables set in every container given fake GPUs.
const (
	// EnvVisibleDevices is what NVIDIA's plugin sets (deviceListStrategy: envvar): the physical
	// GPUs, each once, even when the container got several replicas of one GPU.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvDeviceIDs lists the device IDs the kubelet allocated (replicas included), so a test can
	// see exactly which replicas a container holds.
	EnvDeviceIDs = "FAKE_GPU_DEVICE_IDS"
	// EnvProduct is the fake GPU's product name.
	EnvProduct = "FAKE_GPU_PRODUCT"
)

// Allocator answers Allocate and GetPreferredAllocation for one node's devices.
type Allocator struct {
	settings config.Settings
	devices  []Device
	known    map[string]Device
}

// NewAllocator indexes the node's devices.
func NewAllocator(settings config.Settings, devices []Device) *Allocator {
	known := make(map[string]Device, len(devices))
	for _, d := range devices {
		known[d.ID] = d
	}
	return &Allocator{settings: settings, devices: devices, known: known}
}

// Allocate answers one container's request, with NVIDIA's error messages for requests it
// refuses (the kubelet shows them in the pod's UnexpectedAdmissionError event).
func (a *Allocator) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if a.settings.FailRequestsGreaterThanOne && len(ids) > 1 && slices.ContainsFunc(ids, isReplica) {
		return nil, fmt.Errorf("request for '%v: %v' too large: maximum request size for shared resources is 1", a.settings.ResourceName, len(ids))
	}
	for _, id := range ids {
		if _, ok := a.known[id]; !ok {
			return nil, fmt.Errorf("invalid allocation request for '%s': unknown device: %s", a.settings.ResourceName, id)
		}
	}
	return &pluginapi.ContainerAllocateResponse{Envs: a.envs(ids)}, nil
}

func (a *Allocator) envs(ids []string) map[string]string {
	return map[string]string{
		EnvVisibleDevices: strings.Join(uniquePhysical(ids), ","),
		EnvDeviceIDs:      strings.Join(ids, ","),
		EnvProduct:        a.settings.Product,
	}
}

// uniquePhysical maps device IDs to physical GPU IDs, each once, in order of first appearance.
func uniquePhysical(ids []string) []string {
	var physical []string
	for _, id := range ids {
		if p := physicalOf(id); !slices.Contains(physical, p) {
			physical = append(physical, p)
		}
	}
	return physical
}

// Preferred picks `size` devices from `available`, keeping `mustInclude`, spreading the rest
// over the physical GPUs with the fewest replicas in use, like NVIDIA's distributed
// allocation for time-sliced GPUs: two replicas for one pod land on two GPUs when they can.
func (a *Allocator) Preferred(available, mustInclude []string, size int) []string {
	load := a.replicasInUse(available)
	chosen := slices.Clone(mustInclude)
	for _, id := range mustInclude {
		load[physicalOf(id)]++
	}
	candidates := slices.DeleteFunc(slices.Clone(available), func(id string) bool { return slices.Contains(mustInclude, id) })
	for len(chosen) < size && len(candidates) > 0 {
		best := leastLoaded(candidates, load)
		chosen = append(chosen, candidates[best])
		load[physicalOf(candidates[best])]++
		candidates = slices.Delete(candidates, best, best+1)
	}
	return chosen
}

// replicasInUse counts, per physical GPU, the replicas that are not available (taken by
// other containers).
func (a *Allocator) replicasInUse(available []string) map[string]int {
	load := map[string]int{}
	for _, d := range a.devices {
		if !slices.Contains(available, d.ID) {
			load[d.Physical]++
		}
	}
	return load
}

// leastLoaded returns the index of the candidate on the least used GPU; ties go to the
// smallest ID so the choice is deterministic.
func leastLoaded(candidates []string, load map[string]int) int {
	best := 0
	for i, id := range candidates {
		l, bestLoad := load[physicalOf(id)], load[physicalOf(candidates[best])]
		if l < bestLoad || (l == bestLoad && id < candidates[best]) {
			best = i
		}
	}
	return best
}
