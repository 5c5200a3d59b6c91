// Package config reads the plugin's configuration in the shape of NVIDIA's device plugin
// config file (version: v1, flags, sharing.timeSlicing), so one ConfigMap reads the same for
// this fake plugin and for NVIDIA's real one.
package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// GPUResource is the only resource the fake plugin advertises (no MIG).
const GPUResource = "nvidia.com/gpu"

// sharedSuffix is what renameByDefault appends, as NVIDIA's plugin does.
const sharedSuffix = ".shared"

// Defaults for the fake-only settings (env FAKE_GPU_COUNT, FAKE_GPU_PRODUCT). The product
// matches the KWOK fake GPU nodes in devtools/ebbflow_devtools/gpunodes.py.
const (
	DefaultGPUCount = 2
	DefaultProduct  = "NVIDIA-A100-SXM4-40GB"
	// DefaultMemoryMiB is what GFD reports for the default product.
	DefaultMemoryMiB = 40960
)

// File is NVIDIA's config file, limited to what the fake plugin understands. Unknown
// top-level fields are rejected; `flags` is accepted and ignored (nothing to configure on a
// fake GPU) except migStrategy, which must be none.
type File struct {
	Version string         `json:"version"`
	Flags   map[string]any `json:"flags,omitempty"`
	Sharing *Sharing       `json:"sharing,omitempty"`
}

// Sharing mirrors NVIDIA's `sharing` section; only time-slicing is faked (MPS is not).
type Sharing struct {
	TimeSlicing *TimeSlicing   `json:"timeSlicing,omitempty"`
	MPS         map[string]any `json:"mps,omitempty"`
}

// TimeSlicing mirrors NVIDIA's `sharing.timeSlicing`.
type TimeSlicing struct {
	RenameByDefault            bool                 `json:"renameByDefault,omitempty"`
	FailRequestsGreaterThanOne bool                 `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicatedResource `json:"resources,omitempty"`
}

// ReplicatedResource mirrors one entry of NVIDIA's `sharing.timeSlicing.resources`.
type ReplicatedResource struct {
	Name     string `json:"name"`
	Rename   string `json:"rename,omitempty"`
	Devices  any    `json:"devices,omitempty"`
	Replicas int    `json:"replicas"`
}

// Settings is what the plugin runs with, after validation and defaults.
type Settings struct {
	ResourceName               string // advertised to the kubelet, e.g. nvidia.com/gpu or nvidia.com/gpu.shared
	Replicas                   int    // time-slicing replicas per physical GPU; 1 means no sharing
	Renamed                    bool   // the resource was renamed (GFD then leaves the product label alone)
	FailRequestsGreaterThanOne bool
	GPUCount                   int    // physical fake GPUs per node
	Product                    string // GPU product name for the node label
	MemoryMiB                  int    // memory of one physical GPU for the node label; 0: no label
}

// TimeSliced says whether GPUs are shared; replicas: 1 behaves like no sharing at all.
func (s Settings) TimeSliced() bool { return s.Replicas > 1 }

// Parse validates an NVIDIA-shaped config and returns the settings for one GPU resource.
// An empty document means NVIDIA's defaults: nvidia.com/gpu, no sharing.
func Parse(data []byte, gpuCount int, product string) (Settings, error) {
	var file File
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		return Settings{}, fmt.Errorf("config: %w", err)
	}
	settings, err := file.settings()
	if err != nil {
		return Settings{}, fmt.Errorf("config: %w", err)
	}
	if gpuCount < 1 {
		return Settings{}, fmt.Errorf("config: FAKE_GPU_COUNT: must be >= 1, got %d", gpuCount)
	}
	if strings.TrimSpace(product) == "" {
		return Settings{}, fmt.Errorf("config: FAKE_GPU_PRODUCT: must not be empty")
	}
	settings.GPUCount, settings.Product = gpuCount, product
	return settings, nil
}

func (f File) settings() (Settings, error) {
	if f.Version != "v1" && !(f.Version == "" && f.isEmpty()) {
		return Settings{}, fmt.Errorf("version: must be v1, got %q", f.Version)
	}
	if err := checkFlags(f.Flags); err != nil {
		return Settings{}, err
	}
	plain := Settings{ResourceName: GPUResource, Replicas: 1}
	if f.Sharing == nil {
		return plain, nil
	}
	if f.Sharing.MPS != nil {
		return Settings{}, fmt.Errorf("sharing.mps: not supported by the fake plugin (use sharing.timeSlicing)")
	}
	if f.Sharing.TimeSlicing == nil || len(f.Sharing.TimeSlicing.Resources) == 0 {
		return plain, nil
	}
	return f.Sharing.TimeSlicing.settings()
}

func (f File) isEmpty() bool { return f.Flags == nil && f.Sharing == nil }

// checkFlags refuses MIG, which the fake plugin cannot pretend to partition.
func checkFlags(flags map[string]any) error {
	strategy, ok := flags["migStrategy"]
	if !ok || strategy == "none" {
		return nil
	}
	return fmt.Errorf("flags.migStrategy: only \"none\" is supported by the fake plugin, got %v", strategy)
}

func (t TimeSlicing) settings() (Settings, error) {
	for i, r := range t.Resources {
		if err := r.validate(fmt.Sprintf("sharing.timeSlicing.resources[%d]", i)); err != nil {
			return Settings{}, err
		}
	}
	if len(t.Resources) > 1 {
		return Settings{}, fmt.Errorf("sharing.timeSlicing.resources: %s is listed %d times, want once", GPUResource, len(t.Resources))
	}
	r := t.Resources[0]
	name := r.Rename
	if name == "" && t.RenameByDefault {
		name = r.Name + sharedSuffix
	}
	renamed := name != ""
	if !renamed {
		name = r.Name
	}
	return Settings{
		ResourceName:               name,
		Replicas:                   r.Replicas,
		Renamed:                    renamed,
		FailRequestsGreaterThanOne: t.FailRequestsGreaterThanOne,
	}, nil
}

func (r ReplicatedResource) validate(field string) error {
	if r.Name != GPUResource {
		return fmt.Errorf("%s.name: unknown resource name %q (the fake plugin only has %s)", field, r.Name, GPUResource)
	}
	if r.Replicas < 1 {
		return fmt.Errorf("%s.replicas: must be >= 1, got %d", field, r.Replicas)
	}
	if r.Rename != "" && !strings.HasPrefix(r.Rename, "nvidia.com/") {
		return fmt.Errorf("%s.rename: must be a resource name under nvidia.com/, got %q", field, r.Rename)
	}
	if r.Devices != nil && r.Devices != "all" {
		return fmt.Errorf("%s.devices: only \"all\" is supported by the fake plugin, got %v", field, r.Devices)
	}
	return nil
}

// FromEnvironment reads the config file at path (missing path = NVIDIA's defaults) and the
// fake-only settings from FAKE_GPU_COUNT and FAKE_GPU_PRODUCT.
func FromEnvironment(path string) (Settings, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return Settings{}, fmt.Errorf("config: %w", err)
		}
	}
	count, err := intFromEnv("FAKE_GPU_COUNT", DefaultGPUCount)
	if err != nil {
		return Settings{}, err
	}
	product := os.Getenv("FAKE_GPU_PRODUCT")
	if product == "" {
		product = DefaultProduct
	}
	memory, err := intFromEnv("FAKE_GPU_MEMORY_MIB", DefaultMemoryMiB)
	if err != nil {
		return Settings{}, err
	}
	if memory < 1 {
		return Settings{}, fmt.Errorf("config: FAKE_GPU_MEMORY_MIB: must be >= 1, got %d", memory)
	}
	settings, err := Parse(data, count, product)
	settings.MemoryMiB = memory
	return settings, err
}

func intFromEnv(name string, fallback int) (int, error) {
	value := os.Getenv(name)
	if value == "" {
		return fallback, nil
	}
	n, err := strconv.Atoi(value)
	if err != nil {
		return 0, fmt.Errorf("config: %s: not an integer: %q", name, value)
	}
	return n, nil
}
