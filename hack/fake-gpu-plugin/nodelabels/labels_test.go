package nodelabels

import (
	"context"
	"maps"
	"testing"
	"time"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	fakecorev1 "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	clienttesting "k8s.io/client-go/testing"
)

func TestForComputesGFDLabels(t *testing.T) {
	tests := []struct {
		name     string
		settings config.Settings
		want     map[string]string
	}{
		{"time-sliced keeps the name: product marked SHARED",
			config.Settings{Replicas: 2, GPUCount: 2, Product: "NVIDIA-A100-SXM4-40GB", MemoryMiB: 40960},
			map[string]string{Product: "NVIDIA-A100-SXM4-40GB-SHARED", Count: "2", Replicas: "2", SharingStrategy: "time-slicing", Memory: "40960"}},
		{"time-sliced and renamed: product unchanged",
			config.Settings{Replicas: 4, Renamed: true, GPUCount: 1, Product: "Tesla-T4"},
			map[string]string{Product: "Tesla-T4", Count: "1", Replicas: "4", SharingStrategy: "time-slicing"}},
		{"no sharing",
			config.Settings{Replicas: 1, GPUCount: 8, Product: "NVIDIA H100 80GB HBM3"},
			map[string]string{Product: "NVIDIA-H100-80GB-HBM3", Count: "8", Replicas: "1", SharingStrategy: "none"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := For(tt.settings); !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// fakeNodes is client-go's fake Nodes client backed by an object tracker: a stand-in for the
// API server that is enough to check the patch keeps other labels (the real check is the
// kind cluster).
func fakeNodes(t *testing.T, nodes ...*corev1.Node) *fakecorev1.FakeCoreV1 {
	tracker := clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())
	for _, n := range nodes {
		if err := tracker.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	fake := &clienttesting.Fake{}
	fake.AddReactor("*", "*", clienttesting.ObjectReaction(tracker))
	return &fakecorev1.FakeCoreV1{Fake: fake}
}

func TestApplyMergesLabels(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		"kubernetes.io/hostname": "node-a", Replicas: "1",
	}}}
	tests := []struct {
		name     string
		nodeName string
		wantErr  bool
	}{
		{"existing node gets labels, keeps others", "node-a", false},
		{"missing node is an error to retry", "node-b", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fakeNodes(t, node.DeepCopy())
			labels := For(config.Settings{Replicas: 2, GPUCount: 2, Product: "Fake"})
			err := Apply(context.Background(), client.Nodes(), tt.nodeName, labels)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Apply error %v, want error: %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			got, err := client.Nodes().Get(context.Background(), tt.nodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := maps.Clone(labels)
			want["kubernetes.io/hostname"] = "node-a"
			if !maps.Equal(got.Labels, want) {
				t.Errorf("node labels %v, want %v", got.Labels, want)
			}
		})
	}
}

func TestKeeperLabelsANodeThatAppearsLaterAndRelabelsIt(t *testing.T) {
	client := fakeNodes(t)
	labels := For(config.Settings{Replicas: 2, GPUCount: 2, Product: "Fake"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Keeper{Nodes: client.Nodes(), NodeName: "node-a", Labels: labels, Interval: 20 * time.Millisecond, FirstRetry: 5 * time.Millisecond}.Run(ctx)
		close(done)
	}()
	defer func() { cancel(); <-done }()

	steps := []struct {
		name   string
		before func() error
	}{
		{"node registered after the plugin started", func() error {
			_, err := client.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
			return err
		}},
		{"labels removed by hand come back", func() error {
			_, err := client.Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.UpdateOptions{})
			return err
		}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			if err := step.before(); err != nil {
				t.Fatal(err)
			}
			awaitLabels(t, client, labels)
		})
	}
}

func awaitLabels(t *testing.T, client *fakecorev1.FakeCoreV1, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		node, err := client.Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err == nil && maps.Equal(node.Labels, want) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("node-a never got labels %v", want)
}
