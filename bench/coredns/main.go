// Command coredns is CoreDNS (github.com/coredns/coredns, from its Go
// module) with only the plugins bench/dns compares k3sm's resolver against:
// bind, errors, cache and kubernetes. It is a module of its own, so the k3sm
// module does not depend on CoreDNS and CI never builds it.
//
//	cd bench/coredns && go build -o ../../_output/bench/coredns .
//	go run ./bench/dns -cluster -coredns _output/bench/coredns
//
// It takes CoreDNS's own flags (-conf <Corefile>, -version, -plugins, ...).
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, registered by their init functions.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func main() {
	// Execution order as in CoreDNS's plugin.cfg (core/dnsserver/zdirectives.go).
	if err := dnsserver.SetDirectives([]string{"bind", "errors", "cache", "kubernetes"}); err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	coremain.Run()
}
