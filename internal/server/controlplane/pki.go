package controlplane

import (
	"net"
	"os"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/pki"
)

// Certs are the issued files the components are started with.
type Certs struct {
	ServerCA, ClientCA, RequestHeaderCA *pki.CA
	Serving                             pki.Leaf
	Admin, Scheduler, ControllerManager pki.Leaf
	KubeletClient, AuthProxy            pki.Leaf
	ServiceAccountKey                   string
	// With embedded etcd (etcd.go): its CA, the member's certificate and
	// the apiserver's client certificate.
	EtcdCA                 *pki.CA
	EtcdMember, EtcdClient pki.Leaf
}

// Well-known identities of the server's own clients.
const (
	AdminUser             = "system:admin"
	SchedulerUser         = "system:kube-scheduler"
	ControllerManagerUser = "system:kube-controller-manager"
	// KubeletClientUser is the apiserver's identity towards node APIs (logs, exec).
	KubeletClientUser = "system:kube-apiserver"
	AuthProxyUser     = "system:auth-proxy"
)

// EnsurePKI creates (first start) or loads (later starts) every CA, leaf and
// key, re-issuing leaves whose names changed, and writes the kubeconfigs.
func EnsurePKI(cfg *Config) (*Certs, error) {
	l := datadir.New(cfg.DataDir)
	dir := l.TLSDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var c Certs
	var err error
	if c.ServerCA, err = pki.LoadOrCreateCA(dir, "server-ca", "k3sm-server-ca"); err != nil {
		return nil, err
	}
	if c.ClientCA, err = pki.LoadOrCreateCA(dir, "client-ca", "k3sm-client-ca"); err != nil {
		return nil, err
	}
	if c.RequestHeaderCA, err = pki.LoadOrCreateCA(dir, "request-header-ca", "k3sm-request-header-ca"); err != nil {
		return nil, err
	}
	dns, ips := servingNames(cfg)
	if c.Serving, err = c.ServerCA.Ensure(dir, "serving-kube-apiserver", pki.LeafSpec{
		CommonName: "kube-apiserver", DNSNames: dns, IPs: ips, Server: true}); err != nil {
		return nil, err
	}
	clients := []struct {
		leaf *pki.Leaf
		file string
		ca   *pki.CA
		cn   string
		org  []string
	}{
		{&c.Admin, "client-admin", c.ClientCA, AdminUser, []string{"system:masters"}},
		{&c.Scheduler, "client-kube-scheduler", c.ClientCA, SchedulerUser, nil},
		{&c.ControllerManager, "client-kube-controller-manager", c.ClientCA, ControllerManagerUser, nil},
		{&c.KubeletClient, "client-kube-apiserver", c.ClientCA, KubeletClientUser, nil},
		{&c.AuthProxy, "client-auth-proxy", c.RequestHeaderCA, AuthProxyUser, nil},
	}
	for _, cl := range clients {
		if *cl.leaf, err = cl.ca.Ensure(dir, cl.file, pki.LeafSpec{CommonName: cl.cn, Organization: cl.org, Client: true}); err != nil {
			return nil, err
		}
	}
	if cfg.Datastore.Embedded {
		if err := etcdLeafs(cfg, dir, &c); err != nil {
			return nil, err
		}
	}
	c.ServiceAccountKey = l.ServiceAccountKey()
	if _, err := pki.EnsureKey(c.ServiceAccountKey); err != nil {
		return nil, err
	}
	server := cfg.LocalAPIURL()
	for _, k := range []struct {
		path string
		leaf pki.Leaf
		user string
	}{
		{l.AdminKubeconfig(), c.Admin, "admin"},
		{l.Cred("admin"), c.Admin, "admin"},
		{l.Cred("scheduler"), c.Scheduler, "scheduler"},
		{l.Cred("controller-manager"), c.ControllerManager, "controller-manager"},
	} {
		if err := kubeconfig.WriteClient(k.path, server, c.ServerCA.CertPEM(), k.leaf, k.user); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

func servingNames(cfg *Config) ([]string, []net.IP) {
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + cfg.ClusterDomain}
	var ips []net.IP
	seenIP := map[string]bool{}
	addIP := func(ip net.IP) {
		if ip != nil && !ip.IsUnspecified() && !seenIP[ip.String()] {
			seenIP[ip.String()] = true
			ips = append(ips, ip)
		}
	}
	addIP(net.ParseIP("127.0.0.1"))
	if api, err := APIServiceIP(cfg.ServiceCIDR); err == nil {
		addIP(net.IP(api.AsSlice()))
	}
	addIP(net.ParseIP(cfg.AdvertiseAddress))
	addIP(net.ParseIP(cfg.BindAddress))
	seenDNS := map[string]bool{}
	for _, d := range dns {
		seenDNS[d] = true
	}
	addDNS := func(n string) {
		n = strings.ToLower(n)
		if n != "" && !seenDNS[n] {
			seenDNS[n] = true
			dns = append(dns, n)
		}
	}
	if h, err := os.Hostname(); err == nil {
		addDNS(h)
	}
	for _, san := range cfg.TLSSANs {
		if ip := net.ParseIP(san); ip != nil {
			addIP(ip)
		} else {
			addDNS(san)
		}
	}
	return dns, ips
}
