package join

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/dns"
	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
	"github.com/k3sm-dev/k3sm/internal/agent/mesh"
	"github.com/k3sm-dev/k3sm/internal/agent/netpol"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/serverboot"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Addon serves the join endpoint on the bind address and
// --supervisor-port once authorization is verified, over TLS with the
// apiserver's serving certificate (the names and addresses nodes reach
// the server by). A port taken by another process fails the start.
func Addon(log *slog.Logger) controlplane.Addon {
	if log == nil {
		log = slog.Default()
	}
	return controlplane.Addon{
		Verified: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			if p.Cfg.SupervisorPort == 0 {
				return nil
			}
			rc, err := p.AdminConfig()
			if err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			cert, err := tls.LoadX509KeyPair(p.Certs.Serving.CertPath, p.Certs.Serving.KeyPath)
			if err != nil {
				return fmt.Errorf("join endpoint: %w", err)
			}
			addr := net.JoinHostPort(p.Cfg.BindAddress, strconv.Itoa(p.Cfg.SupervisorPort))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return &controlplane.FieldError{Flag: "supervisor-port", Value: strconv.Itoa(p.Cfg.SupervisorPort),
					Problem: "cannot listen on " + addr + ": " + err.Error(), Fix: "stop what listens there, or pass another --supervisor-port (0: no join endpoint)"}
			}
			e := &Endpoint{Client: cs, ServerCA: p.Certs.ServerCA, ClientCA: p.Certs.ClientCA, Settings: Settings(p.Cfg), Log: log,
				OnJoin: func(ctx context.Context, node string) error { return AgentRBAC(ctx, cs, node) }}
			if p.Cfg.Datastore.Embedded {
				e.ServerBootstrap = func(ctx context.Context, tok joinv1.Token) (*joinv1.ServerBootstrapResponse, error) {
					return ServerBootstrap(ctx, p, tok)
				}
			}
			self := e.Settings.Servers[0]
			e.Servers = func(ctx context.Context) ([]string, error) { return APIServers(ctx, cs, self) }
			srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
				WriteTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
				TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
				ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
			go func() {
				if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("join endpoint stopped", "err", err)
				}
			}()
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			log.Info("join endpoint listening", "addr", addr)
			return nil
		},
	}
}

// Settings are the cluster settings a joining node receives.
func Settings(cfg *controlplane.Config) joinv1.ClusterSettings {
	s := joinv1.ClusterSettings{
		Servers:     []string{"https://" + net.JoinHostPort(cfg.AdvertiseAddress, strconv.Itoa(cfg.HTTPSPort))},
		ClusterCIDR: cfg.ClusterCIDR, ServiceCIDR: cfg.ServiceCIDR, ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain,
	}
	if ip, err := controlplane.APIServiceIP(cfg.ServiceCIDR); err == nil {
		s.APIServiceIP = ip.String()
	}
	return s
}

// APIServers lists the cluster's apiservers as URLs, self first: the
// ready addresses of the kubernetes Service's EndpointSlices, which every
// apiserver keeps its advertise address in while it runs (none with a
// loopback advertise address: then self alone).
func APIServers(ctx context.Context, cs kubernetes.Interface, self string) ([]string, error) {
	sls, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return nil, err
	}
	list := []string{self}
	for _, sl := range sls.Items {
		port := 0
		for _, p := range sl.Ports {
			if p.Name != nil && *p.Name == "https" && p.Port != nil {
				port = int(*p.Port)
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				u := "https://" + net.JoinHostPort(a, strconv.Itoa(port))
				if !slices.Contains(list, u) {
					list = append(list, u)
				}
			}
		}
	}
	return list, nil
}

// ServerBootstrap seals the cluster's bootstrap record for tok and lists
// the etcd members' client URLs, for a server joining a cluster with
// embedded etcd.
func ServerBootstrap(ctx context.Context, p *controlplane.Plane, tok joinv1.Token) (*joinv1.ServerBootstrapResponse, error) {
	c := p.Cfg
	b, err := serverboot.Collect(p.Layout, serverboot.Settings(c.ClusterCIDR, c.ServiceCIDR, c.ClusterDNS, c.ClusterDomain))
	if err != nil {
		return nil, err
	}
	rec, err := serverboot.Seal(b, tok)
	if err != nil {
		return nil, err
	}
	cli, err := p.EtcdClient(nil)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd members: %w", err)
	}
	resp := &joinv1.ServerBootstrapResponse{Record: rec}
	for _, m := range list.Members {
		for _, u := range m.ClientURLs {
			if !strings.Contains(u, "://127.0.0.1:") {
				resp.EtcdClientURLs = append(resp.EtcdClientURLs, u)
			}
		}
	}
	if len(resp.EtcdClientURLs) == 0 {
		return nil, errors.New("no etcd member advertises an address other servers reach: start this server with a non-loopback --advertise-address")
	}
	return resp, nil
}

// AgentRBAC binds a joining node's identities: its own (NodeRBAC) and
// its local-path provisioner's.
func AgentRBAC(ctx context.Context, cs kubernetes.Interface, node string) error {
	if err := NodeRBAC(ctx, cs, joinv1.NodeUser(node)); err != nil {
		return err
	}
	if err := localpath.EnsureRBAC(ctx, cs, joinv1.LocalPathUser(node)); err != nil {
		return fmt.Errorf("local-path provisioner RBAC: %w", err)
	}
	return nil
}

// NodeRBAC binds a node's user to what its agent parts read beyond the
// Node authorizer's grant: the Service proxy, the cluster DNS, the
// NetworkPolicy enforcer and the mesh (MeshPeers), as the server's own
// node is bound.
func NodeRBAC(ctx context.Context, cs kubernetes.Interface, user string) error {
	for _, f := range []struct {
		what   string
		ensure func(context.Context, kubernetes.Interface, string) error
	}{{"service proxy", proxy.EnsureRBAC}, {"cluster DNS", dns.EnsureRBAC}, {"NetworkPolicy", netpol.EnsureRBAC}, {"mesh", mesh.EnsureRBAC}} {
		if err := f.ensure(ctx, cs, user); err != nil {
			return fmt.Errorf("%s RBAC: %w", f.what, err)
		}
	}
	return nil
}
