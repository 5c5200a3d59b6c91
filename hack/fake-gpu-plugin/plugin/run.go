package plugin

import (
	"context"
	"log"
	"os"
	"path/filepath"
	"time"
)

// Runner keeps one plugin registered with the kubelet: it serves, registers, and starts over
// whenever the kubelet restarts. A restarting kubelet recreates kubelet.sock and wipes the
// plugin sockets in its directory, and forgets every plugin, so real plugins (NVIDIA's
// included) re-serve and re-register; the Runner does the same, by polling, which needs no
// inotify and no extra dependency.
type Runner struct {
	Dir          string        // the kubelet's device-plugins directory
	SocketName   string        // this plugin's socket file name in Dir
	ResourceName string        // e.g. nvidia.com/gpu
	Devices      []Device      // advertised devices
	Allocator    *Allocator    // answers Allocate
	PollInterval time.Duration // how often to look for a kubelet restart
}

// Run serves and registers until ctx is cancelled.
func (r *Runner) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := r.serveOnce(ctx); err != nil {
			log.Printf("%v; retrying", err)
			r.sleep(ctx)
		}
	}
	return nil
}

// serveOnce serves one kubelet's lifetime: start, register, wait for a restart, stop.
func (r *Runner) serveOnce(ctx context.Context) error {
	kubelet, err := r.waitForKubelet(ctx)
	if err != nil || kubelet == nil {
		return err
	}
	server := NewServer(r.ResourceName, r.Devices, r.Allocator, filepath.Join(r.Dir, r.SocketName))
	if err := server.Start(); err != nil {
		return err
	}
	defer server.Stop()
	if err := server.Register(ctx, r.kubeletSocket()); err != nil {
		return err
	}
	log.Printf("registered %s (%d devices) with the kubelet on %s", r.ResourceName, len(r.Devices), r.SocketName)
	r.waitForRestart(ctx, kubelet)
	if ctx.Err() == nil {
		log.Printf("kubelet restarted or plugin socket removed; serving and registering again")
	}
	return nil
}

func (r *Runner) kubeletSocket() string { return filepath.Join(r.Dir, "kubelet.sock") }

// waitForKubelet returns the kubelet socket's identity once it exists (nil if ctx ends first).
func (r *Runner) waitForKubelet(ctx context.Context) (os.FileInfo, error) {
	for {
		if info, err := os.Stat(r.kubeletSocket()); err == nil {
			return info, nil
		}
		if !r.sleep(ctx) {
			return nil, nil
		}
	}
}

// waitForRestart returns when ctx ends, kubelet.sock is replaced, or our socket is deleted.
func (r *Runner) waitForRestart(ctx context.Context, kubelet os.FileInfo) {
	for r.sleep(ctx) {
		now, err := os.Stat(r.kubeletSocket())
		// Inode numbers get reused, so a recreated socket is also told apart by its mtime.
		if err != nil || !os.SameFile(kubelet, now) || !now.ModTime().Equal(kubelet.ModTime()) {
			return
		}
		if _, err := os.Stat(filepath.Join(r.Dir, r.SocketName)); err != nil {
			return
		}
	}
}

// sleep waits one poll interval; false when ctx ended instead.
func (r *Runner) sleep(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(r.PollInterval):
		return true
	}
}
