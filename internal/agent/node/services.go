package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"

	"github.com/k3sm-dev/k3sm/internal/agent/dns"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	netdclient "github.com/k3sm-dev/k3sm/internal/netd/client"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
)

// serveServices runs the node's Service proxy and cluster DNS (both in this
// process: another process of the big binary would cost ~30 MiB) until ctx
// ends. They dial from the node's network, where every pod is reachable.
func serveServices(ctx context.Context, cfg Config, apiURL string, kc kubernetes.Interface, recorder record.EventRecorder, provider *Provider, log *slog.Logger) error {
	nodeIP, err := netip.ParseAddr(cfg.IP)
	if err != nil {
		return fmt.Errorf("service proxy: node IP %q: %w", cfg.IP, err)
	}
	// The apiserver as this node reaches it: the kubernetes Service's
	// endpoint when the apiserver publishes none (a loopback address).
	var api netip.AddrPort
	if u, err := url.Parse(apiURL); err == nil {
		port := u.Port()
		if port == "" {
			port = "443"
		}
		api, _ = netip.ParseAddrPort(net.JoinHostPort(u.Hostname(), port))
	}
	pcfg := proxy.Config{Client: kc, NodeName: cfg.Name, NodeIPs: []netip.Addr{nodeIP}, APIServer: api, Recorder: recorder, Log: log.With("component", "proxy")}
	if pods, err := netip.ParsePrefix(cfg.ClusterCIDR); err == nil {
		pcfg.PodRanges = []netip.Prefix{pods.Masked()}
	}
	if cfg.NetdSocket != "" {
		// --service-proxy: Services in the kernel, through k3sm-netd.
		pcfg.Kernel = proxy.NetdKernel{Client: netdclient.New(cfg.NetdSocket)}
	}
	px, err := proxy.New(pcfg)
	if err != nil {
		return fmt.Errorf("service proxy: %w", err)
	}
	provider.setHostPortSink(px.SetHostPorts)
	// The node itself (unlike its pods) reaches a loopback stub resolver.
	upstreams, err := dns.ResolvConfUpstreams("/etc/resolv.conf")
	if err != nil {
		log.Warn("cluster DNS forwards nothing outside the cluster", "err", err)
	}
	// The reverse names of the Service and pod ranges are the cluster's:
	// answered here, never asked of the host's resolvers.
	var ranges []netip.Prefix
	for _, c := range []string{cfg.ServiceCIDR, cfg.ClusterCIDR} {
		if c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("cluster DNS: range %q: %w", c, err)
		}
		ranges = append(ranges, p)
	}
	ds, err := dns.New(dns.Config{Client: kc, Domain: cfg.ClusterDomain, Listen: []string{net.JoinHostPort(cfg.ClusterDNS, "53")},
		Upstreams: upstreams, ForwardFile: cfg.DNSConfig, ReverseRanges: ranges, PodNamespace: provider.podNamespace, Log: log.With("component", "dns")})
	if err != nil {
		return fmt.Errorf("cluster DNS on %s: %w", cfg.ClusterDNS, err)
	}
	log.Info("serving Services and cluster DNS", "dns", cfg.ClusterDNS, "domain", cfg.ClusterDomain, "serviceProxy", px.Mode())
	var g errgroup.Group
	g.Go(func() error { return px.Run(ctx) })
	g.Go(func() error { return ds.Run(ctx) })
	return g.Wait()
}
