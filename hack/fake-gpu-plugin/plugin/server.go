package plugin

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Server serves the DevicePlugin gRPC service on a unix socket in the kubelet's
// device-plugins directory.
type Server struct {
	pluginapi.UnimplementedDevicePluginServer

	resourceName string
	devices      []Device
	allocator    *Allocator
	socket       string
	grpc         *grpc.Server
}

// NewServer prepares a server for `devices` on socket path `socket`; Start serves it.
func NewServer(resourceName string, devices []Device, allocator *Allocator, socket string) *Server {
	return &Server{resourceName: resourceName, devices: devices, allocator: allocator, socket: socket}
}

// Start listens on the socket (replacing a stale one from a previous run) and serves in the
// background until Stop.
func (s *Server) Start() error {
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	listener, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	s.grpc = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s.grpc, s)
	go func() {
		if err := s.grpc.Serve(listener); err != nil {
			log.Printf("device plugin server stopped: %v", err)
		}
	}()
	return nil
}

// Stop ends the server (and every ListAndWatch stream) and removes the socket.
func (s *Server) Stop() {
	if s.grpc != nil {
		s.grpc.Stop()
	}
	_ = os.Remove(s.socket)
}

// Register tells the kubelet, through its registration socket, where this plugin serves.
func (s *Server) Register(ctx context.Context, kubeletSocket string) error {
	conn, err := dialUnix(kubeletSocket)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket), // relative to the kubelet's device-plugins directory
		ResourceName: s.resourceName,
		Options:      options(),
	})
	if err != nil {
		return fmt.Errorf("register %s with the kubelet: %w", s.resourceName, err)
	}
	return nil
}

// dialUnix opens a gRPC client connection to a unix socket (connecting lazily).
func dialUnix(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions: no PreStartContainer needed; preferred allocation is offered.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the device list once; fake GPUs never turn unhealthy, so the stream then
// stays open, silent, until the kubelet hangs up or the server stops.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: apiDevices(s.devices)}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func apiDevices(devices []Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devices))
	for i, d := range devices {
		out[i] = &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy}
	}
	return out
}

// Allocate answers every container of the request; one refused container refuses the pod.
func (s *Server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, container := range req.ContainerRequests {
		answer, err := s.allocator.Allocate(container.DevicesIds)
		if err != nil {
			log.Printf("allocate %v: %v", container.DevicesIds, err)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, answer)
	}
	return resp, nil
}

// GetPreferredAllocation spreads replicas over physical GPUs (see Allocator.Preferred).
func (s *Server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		ids := s.allocator.Preferred(c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer is never requested (PreStartRequired is false); a no-op to be safe.
func (s *Server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
