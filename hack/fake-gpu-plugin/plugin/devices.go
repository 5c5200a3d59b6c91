// Package plugin is the fake NVIDIA device plugin: the devices it advertises, how it answers
// the kubelet's gRPC calls, and how it (re-)registers with the kubelet.
package plugin

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
)

// replicaSeparator joins a physical GPU ID and a replica number, as NVIDIA's plugin does.
const replicaSeparator = "::"

// Device is one device advertised to the kubelet: a whole fake GPU, or one time-slicing
// replica of it.
type Device struct {
	ID       string // what the kubelet schedules: GPU-<uuid> or GPU-<uuid>::<replica>
	Physical string // GPU-<uuid> of the physical GPU behind it
}

// PhysicalID is the NVIDIA-style ID of fake GPU `index` on `nodeName`. It is derived from the
// node name, so a restarted plugin advertises the same IDs and the kubelet's checkpointed
// allocations stay valid; different nodes never share an ID.
func PhysicalID(nodeName string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("ebbflow-fake-gpu/%s/%d", nodeName, index)))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50 // UUID version 5 (name-based, SHA)
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Devices lists every device of the node: GPUCount physical GPUs, each advertised Replicas
// times when time-sliced, ordered by GPU then replica.
func Devices(nodeName string, s config.Settings) []Device {
	devices := make([]Device, 0, s.GPUCount*s.Replicas)
	for gpu := 0; gpu < s.GPUCount; gpu++ {
		physical := PhysicalID(nodeName, gpu)
		if !s.TimeSliced() {
			devices = append(devices, Device{ID: physical, Physical: physical})
			continue
		}
		for replica := 0; replica < s.Replicas; replica++ {
			id := fmt.Sprintf("%s%s%d", physical, replicaSeparator, replica)
			devices = append(devices, Device{ID: id, Physical: physical})
		}
	}
	return devices
}

// physicalOf strips the replica annotation from a device ID.
func physicalOf(id string) string {
	physical, _, _ := strings.Cut(id, replicaSeparator)
	return physical
}

// isReplica says whether an ID carries a replica annotation.
func isReplica(id string) bool { return strings.Contains(id, replicaSeparator) }
