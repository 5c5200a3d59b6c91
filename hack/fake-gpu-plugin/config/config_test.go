package config

import (
	"strings"
	"testing"
)

// nvidiaTimeSlicing is the config from NVIDIA's time-slicing documentation, replicas 2.
const nvidiaTimeSlicing = `
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
`

func TestParseAcceptsNVIDIAShapes(t *testing.T) {
	tests := []struct {
		name   string
		config string
		want   Settings
	}{
		{"empty document means no sharing", ``,
			Settings{ResourceName: GPUResource, Replicas: 1}},
		{"version only means no sharing", "version: v1\n",
			Settings{ResourceName: GPUResource, Replicas: 1}},
		{"NVIDIA's documented time-slicing config", nvidiaTimeSlicing,
			Settings{ResourceName: GPUResource, Replicas: 2}},
		{"renameByDefault appends .shared", `
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources: [{name: nvidia.com/gpu, replicas: 4}]
`, Settings{ResourceName: "nvidia.com/gpu.shared", Replicas: 4, Renamed: true, FailRequestsGreaterThanOne: true}},
		{"explicit rename wins over renameByDefault", `
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources: [{name: nvidia.com/gpu, rename: nvidia.com/gpu-slice, replicas: 3, devices: all}]
`, Settings{ResourceName: "nvidia.com/gpu-slice", Replicas: 3, Renamed: true}},
		{"timeSlicing without resources means no sharing", "version: v1\nsharing: {timeSlicing: {}}\n",
			Settings{ResourceName: GPUResource, Replicas: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.config), 2, "Fake-GPU")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.want.GPUCount, tt.want.Product = 2, "Fake-GPU"
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseRejectsInvalidConfigNamingTheField(t *testing.T) {
	tests := []struct {
		name      string
		config    string
		gpuCount  int
		wantInErr string
	}{
		{"replicas below one", oneResource("name: nvidia.com/gpu, replicas: 0"), 2,
			"sharing.timeSlicing.resources[0].replicas: must be >= 1, got 0"},
		{"replicas missing", oneResource("name: nvidia.com/gpu"), 2,
			"sharing.timeSlicing.resources[0].replicas"},
		{"unknown resource name", oneResource("name: nvidia.com/mig-1g.5gb, replicas: 2"), 2,
			`sharing.timeSlicing.resources[0].name: unknown resource name "nvidia.com/mig-1g.5gb"`},
		{"resource listed twice", oneResource("name: nvidia.com/gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3"), 2,
			"sharing.timeSlicing.resources: nvidia.com/gpu is listed 2 times"},
		{"rename outside nvidia.com", oneResource("name: nvidia.com/gpu, rename: gpu, replicas: 2"), 2,
			"sharing.timeSlicing.resources[0].rename"},
		{"devices subset", oneResource("name: nvidia.com/gpu, replicas: 2, devices: [0]"), 2,
			"sharing.timeSlicing.resources[0].devices"},
		{"wrong version", "version: v2\n", 2, `version: must be v1, got "v2"`},
		{"missing version", "sharing: {timeSlicing: {}}\n", 2, `version: must be v1, got ""`},
		{"unknown top-level field", "version: v1\nsharding: {}\n", 2, `unknown field "sharding"`},
		{"unknown timeSlicing field", "version: v1\nsharing: {timeSlicing: {replicas: 2}}\n", 2, `unknown field "replicas"`},
		{"replicas not a number", oneResource("name: nvidia.com/gpu, replicas: two"), 2, "replicas"},
		{"MPS sharing", "version: v1\nsharing: {mps: {resources: []}}\n", 2, "sharing.mps: not supported"},
		{"MIG strategy", "version: v1\nflags: {migStrategy: single}\n", 2, "flags.migStrategy"},
		{"no physical GPUs", nvidiaTimeSlicing, 0, "FAKE_GPU_COUNT: must be >= 1, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.config), tt.gpuCount, "Fake-GPU")
			if err == nil {
				t.Fatalf("Parse accepted an invalid config")
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not mention %q", err, tt.wantInErr)
			}
		})
	}
}

func oneResource(fields string) string {
	return "version: v1\nsharing:\n  timeSlicing:\n    resources: [{" + fields + "}]\n"
}

func TestFromEnvironmentReadsFakeSettings(t *testing.T) {
	tests := []struct {
		name        string
		count       string
		product     string
		memory      string
		wantCount   int
		wantProduct string
		wantMemory  int
		wantErr     string
	}{
		{"defaults", "", "", "", DefaultGPUCount, DefaultProduct, DefaultMemoryMiB, ""},
		{"overrides", "4", "Tesla-T4", "15360", 4, "Tesla-T4", 15360, ""},
		{"count not a number", "many", "", "", 0, "", 0, "FAKE_GPU_COUNT: not an integer"},
		{"memory not positive", "", "", "0", 0, "", 0, "FAKE_GPU_MEMORY_MIB: must be >= 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("FAKE_GPU_COUNT", tt.count)
			t.Setenv("FAKE_GPU_PRODUCT", tt.product)
			t.Setenv("FAKE_GPU_MEMORY_MIB", tt.memory)
			got, err := FromEnvironment("")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromEnvironment: %v", err)
			}
			if got.GPUCount != tt.wantCount || got.Product != tt.wantProduct || got.MemoryMiB != tt.wantMemory {
				t.Errorf("got %d x %q of %d MiB, want %d x %q of %d MiB", got.GPUCount, got.Product, got.MemoryMiB, tt.wantCount, tt.wantProduct, tt.wantMemory)
			}
		})
	}
}
