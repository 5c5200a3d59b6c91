// Command coredns is CoreDNS with the plugins the kind cluster's Corefile uses (kubeadm's default:
// errors, health, ready, kubernetes, prometheus, forward, cache, loop, reload, loadbalance) and log
// and hosts for debugging, selected at compile time as CoreDNS documents for custom builds. The
// release's own main imports every plugin (cloud DNS providers, tracing, dnstap, QUIC, ...), which
// made it one of the slowest tools to build on a fresh machine.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
