package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's Registration service on kubelet.sock, recording each request.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	requests chan *pluginapi.RegisterRequest
	server   *grpc.Server
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	listener, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatalf("fake kubelet: %v", err)
	}
	k := &fakeKubelet{requests: make(chan *pluginapi.RegisterRequest, 4), server: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(listener) }()
	return k
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- req
	return &pluginapi.Empty{}, nil
}

// restart stops the fake kubelet and wipes the directory's sockets, as a kubelet restart does.
func (k *fakeKubelet) restart(t *testing.T, dir string) *fakeKubelet {
	k.server.Stop()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
	return startFakeKubelet(t, dir)
}

func (k *fakeKubelet) awaitRegistration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case req := <-k.requests:
		return req
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register with the kubelet")
		return nil
	}
}

// shortTempDir keeps unix socket paths under the 108-byte limit t.TempDir can exceed.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "fgp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startRunner(t *testing.T, dir string) (*Runner, context.CancelFunc) {
	s := settings(2, 2)
	s.ResourceName = "nvidia.com/gpu.shared"
	devices := Devices("node-a", s)
	runner := &Runner{
		Dir: dir, SocketName: "fake-gpu.sock", ResourceName: s.ResourceName,
		Devices: devices, Allocator: NewAllocator(s, devices), PollInterval: 20 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = runner.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return runner, cancel
}

func TestPluginServesTheKubeletOverUnixSockets(t *testing.T) {
	dir := shortTempDir(t)
	kubelet := startFakeKubelet(t, dir)
	runner, _ := startRunner(t, dir)

	req := kubelet.awaitRegistration(t)
	assertRegistration(t, req)
	client := connect(t, filepath.Join(dir, req.Endpoint))
	t.Run("ListAndWatch sends every device, healthy", func(t *testing.T) {
		assertDeviceList(t, client, runner.Devices)
	})
	t.Run("Allocate sets NVIDIA_VISIBLE_DEVICES to the physical GPU", func(t *testing.T) {
		assertAllocate(t, client, runner.Devices)
	})
	t.Run("GetDevicePluginOptions offers preferred allocation", func(t *testing.T) {
		opts, err := client.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
		if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
			t.Errorf("options %v, err %v", opts, err)
		}
	})
	t.Run("registers again after a kubelet restart", func(t *testing.T) {
		kubelet = kubelet.restart(t, dir)
		t.Cleanup(kubelet.server.Stop)
		assertRegistration(t, kubelet.awaitRegistration(t))
		assertDeviceList(t, connect(t, filepath.Join(dir, req.Endpoint)), runner.Devices)
	})
}

func assertRegistration(t *testing.T, req *pluginapi.RegisterRequest) {
	t.Helper()
	if req.Version != pluginapi.Version || req.ResourceName != "nvidia.com/gpu.shared" || req.Endpoint != "fake-gpu.sock" {
		t.Errorf("registered %+v", req)
	}
	if !req.Options.GetPreferredAllocationAvailable {
		t.Errorf("registration options %v do not offer preferred allocation", req.Options)
	}
}

func connect(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := dialUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func assertDeviceList(t *testing.T, client pluginapi.DevicePluginClient, want []Device) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatalf("ListAndWatch: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch Recv: %v", err)
	}
	if len(resp.Devices) != len(want) {
		t.Fatalf("got %d devices, want %d", len(resp.Devices), len(want))
	}
	for i, d := range resp.Devices {
		if d.ID != want[i].ID || d.Health != pluginapi.Healthy {
			t.Errorf("device %d: %s %s, want %s Healthy", i, d.ID, d.Health, want[i].ID)
		}
	}
}

func assertAllocate(t *testing.T, client pluginapi.DevicePluginClient, devices []Device) {
	t.Helper()
	resp, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{devices[0].ID, devices[1].ID}}},
	})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if got := resp.ContainerResponses[0].Envs[EnvVisibleDevices]; got != devices[0].Physical {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, devices[0].Physical)
	}
	_, err = client.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope::0"}}},
	})
	if err == nil {
		t.Error("Allocate accepted an unknown device over gRPC")
	}
}
