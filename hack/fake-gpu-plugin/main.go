// Command fake-gpu-plugin advertises fake, time-sliced NVIDIA GPUs to the kubelet and labels
// the node as GPU feature discovery would. For Ebbflow's dev (kind) cluster only; see README.md.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"ebbflow.dev/hack/fake-gpu-plugin/config"
	"ebbflow.dev/hack/fake-gpu-plugin/nodelabels"
	"ebbflow.dev/hack/fake-gpu-plugin/plugin"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const socketName = "ebbflow-fake-gpu.sock"

func main() {
	configFile := flag.String("config-file", os.Getenv("CONFIG_FILE"), "NVIDIA device plugin config file (env CONFIG_FILE); empty: no sharing")
	dir := flag.String("device-plugin-path", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	flag.Parse()

	settings, err := config.FromEnvironment(*configFile)
	if err != nil {
		log.Fatal(err)
	}
	nodeName := nodeName()
	log.Printf("node %s: %d x %s as %s, %d time-slicing replica(s) per GPU", nodeName, settings.GPUCount, settings.Product, settings.ResourceName, settings.Replicas)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go labelNode(ctx, nodeName, settings)

	devices := plugin.Devices(nodeName, settings)
	runner := &plugin.Runner{
		Dir:          *dir,
		SocketName:   socketName,
		ResourceName: settings.ResourceName,
		Devices:      devices,
		Allocator:    plugin.NewAllocator(settings, devices),
		PollInterval: time.Second,
	}
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// nodeName comes from the downward API (NODE_NAME); the host name is the fallback so the
// plugin also runs by hand, where device IDs then derive from the host name.
func nodeName() string {
	if name := os.Getenv("NODE_NAME"); name != "" {
		return name
	}
	name, err := os.Hostname()
	if err != nil {
		log.Fatalf("NODE_NAME unset and no host name: %v", err)
	}
	return name
}

// labelNode labels the node in the background; outside a cluster it only logs why not.
func labelNode(ctx context.Context, nodeName string, settings config.Settings) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Printf("not labelling the node (no in-cluster config): %v", err)
		return
	}
	client, err := corev1client.NewForConfig(cfg)
	if err != nil {
		log.Printf("not labelling the node: %v", err)
		return
	}
	nodelabels.Keeper{
		Nodes:      client.Nodes(),
		NodeName:   nodeName,
		Labels:     nodelabels.For(settings),
		Interval:   time.Minute,
		FirstRetry: time.Second,
	}.Run(ctx)
}
