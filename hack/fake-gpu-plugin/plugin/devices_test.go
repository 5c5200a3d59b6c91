package plugin

import (
	"regexp"
	"testing"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
)

var (
	physicalIDPattern = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	replicaIDPattern  = regexp.MustCompile(`^GPU-[0-9a-f-]{36}::[0-9]+$`)
)

func settings(gpus, replicas int) config.Settings {
	return config.Settings{ResourceName: config.GPUResource, Replicas: replicas, GPUCount: gpus, Product: "Fake-GPU"}
}

func TestDevicesAdvertisesGPUsTimesReplicas(t *testing.T) {
	tests := []struct {
		name      string
		gpus      int
		replicas  int
		wantCount int
		pattern   *regexp.Regexp
	}{
		{"no sharing: physical IDs", 2, 1, 2, physicalIDPattern},
		{"time-sliced: annotated replica IDs", 2, 2, 4, replicaIDPattern},
		{"many replicas", 3, 8, 24, replicaIDPattern},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devices := Devices("node-a", settings(tt.gpus, tt.replicas))
			if len(devices) != tt.wantCount {
				t.Fatalf("got %d devices, want %d", len(devices), tt.wantCount)
			}
			seen := map[string]bool{}
			physical := map[string]int{}
			for _, d := range devices {
				if !tt.pattern.MatchString(d.ID) || len(d.ID) > 63 {
					t.Errorf("device ID %q has the wrong shape", d.ID)
				}
				if seen[d.ID] {
					t.Errorf("duplicate device ID %q", d.ID)
				}
				seen[d.ID] = true
				physical[d.Physical]++
			}
			if len(physical) != tt.gpus {
				t.Errorf("devices span %d physical GPUs, want %d", len(physical), tt.gpus)
			}
		})
	}
}

func TestPhysicalIDs(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{"stable across restarts", PhysicalID("node-a", 0), PhysicalID("node-a", 0), true},
		{"differ by index", PhysicalID("node-a", 0), PhysicalID("node-a", 1), false},
		{"differ by node", PhysicalID("node-a", 0), PhysicalID("node-b", 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !physicalIDPattern.MatchString(tt.a) {
				t.Errorf("%q is not a GPU-<uuid>", tt.a)
			}
			if (tt.a == tt.b) != tt.same {
				t.Errorf("%q vs %q: same=%v, want %v", tt.a, tt.b, tt.a == tt.b, tt.same)
			}
		})
	}
}
