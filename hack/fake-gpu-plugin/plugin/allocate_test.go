package plugin

import (
	"slices"
	"strings"
	"testing"
)

func TestAllocate(t *testing.T) {
	gpu0, gpu1 := PhysicalID("node-a", 0), PhysicalID("node-a", 1)
	tests := []struct {
		name        string
		replicas    int
		failOverOne bool
		ids         []string
		wantVisible string
		wantErr     string
	}{
		{"one replica", 2, false, []string{gpu0 + "::1"}, gpu0, ""},
		{"replicas of one GPU are deduplicated", 2, false, []string{gpu0 + "::0", gpu0 + "::1"}, gpu0, ""},
		{"replicas of two GPUs keep request order", 2, false, []string{gpu1 + "::0", gpu0 + "::1", gpu1 + "::1"}, gpu1 + "," + gpu0, ""},
		{"whole GPUs without sharing", 1, false, []string{gpu0, gpu1}, gpu0 + "," + gpu1, ""},
		{"failRequestsGreaterThanOne allows one", 2, true, []string{gpu1 + "::0"}, gpu1, ""},
		{"failRequestsGreaterThanOne refuses two", 2, true, []string{gpu0 + "::0", gpu1 + "::0"}, "",
			"request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1"},
		{"failRequestsGreaterThanOne ignores unshared GPUs", 1, true, []string{gpu0, gpu1}, gpu0 + "," + gpu1, ""},
		{"unknown device", 2, false, []string{gpu0 + "::7"}, "",
			"invalid allocation request for 'nvidia.com/gpu': unknown device: " + gpu0 + "::7"},
		{"device of another node", 2, false, []string{PhysicalID("node-b", 0) + "::0"}, "", "unknown device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := settings(2, tt.replicas)
			s.FailRequestsGreaterThanOne = tt.failOverOne
			resp, err := NewAllocator(s, Devices("node-a", s)).Allocate(tt.ids)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			want := map[string]string{
				EnvVisibleDevices: tt.wantVisible,
				EnvDeviceIDs:      strings.Join(tt.ids, ","),
				EnvProduct:        "Fake-GPU",
			}
			for k, v := range want {
				if resp.Envs[k] != v {
					t.Errorf("env %s=%q, want %q", k, resp.Envs[k], v)
				}
			}
		})
	}
}

func TestPreferredSpreadsReplicasOverGPUs(t *testing.T) {
	s := settings(2, 2)
	alloc := NewAllocator(s, Devices("node-a", s))
	g0, g1 := PhysicalID("node-a", 0), PhysicalID("node-a", 1)
	all := []string{g0 + "::0", g0 + "::1", g1 + "::0", g1 + "::1"}
	tests := []struct {
		name         string
		available    []string
		mustInclude  []string
		size         int
		wantPhysical []string // physical GPU of each chosen device, in order
	}{
		{"two replicas on two GPUs", all, nil, 2, []string{g0, g1}},
		{"avoid the busier GPU", []string{g0 + "::1", g1 + "::0", g1 + "::1"}, nil, 1, []string{g1}},
		{"must-include kept, rest spread", all, []string{g1 + "::1"}, 2, []string{g1, g0}},
		{"fewer available than asked", []string{g0 + "::0"}, nil, 2, []string{g0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := alloc.Preferred(tt.available, tt.mustInclude, tt.size)
			var physical []string
			for _, id := range got {
				physical = append(physical, physicalOf(id))
			}
			if !slices.Equal(physical, tt.wantPhysical) {
				t.Errorf("chose %v, want devices on %v", got, tt.wantPhysical)
			}
		})
	}
}
