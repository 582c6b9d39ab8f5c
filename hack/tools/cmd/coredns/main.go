// Command coredns is a minimal CoreDNS for the local cluster's DNS, built from
// the github.com/coredns/coredns module at the version pinned in ../../go.mod.
//
// It follows CoreDNS's documented way to build a custom server: blank-import
// the plugins wanted, set dnsserver.Directives to their names, and call
// coremain.Run. Only what a cluster DNS needs is compiled in: kubernetes
// (answers cluster.local from the API server), cache, loadbalance, errors,
// log, health and ready (the probes), reload (picks up Corefile edits) and
// whoami (a trivial answer for checking the server is up). The kubernetes and
// cache plugins import prometheus (metrics), metadata and transfer themselves,
// so those are registered too (`coredns -plugins` lists them); of those only
// prometheus is a directive, so a Corefile's usual `prometheus :9153` works.
// There is deliberately no forward plugin: the cluster has no route out, so
// names outside the cluster zones get no answer from this server.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives lists the plugins a Corefile may name, in the order CoreDNS
// chains them: upstream's plugin.cfg order (dnsserver.Directives' default),
// keeping only these.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"whoami",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
