// Command coredns is CoreDNS with only the plugins the real node's Corefile uses
// (qwen_devtools/devcluster/nodecomponents.py: corefile). It is CoreDNS's own way of choosing plugins at
// compile time: its main package imports every plugin of plugin.cfg, this one imports five and lists them
// in dnsserver.Directives in plugin.cfg's order. Leaving out the cloud backends (Route 53, Azure, Cloud
// DNS), etcd, dnstap, tracing and the rest cuts the first build from about 5 minutes to under 2.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

// The plugins in the order plugin.cfg gives them (the order a query passes through them).
func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "template", "kubernetes"}
}

func main() { coremain.Run() }
