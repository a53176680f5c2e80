// Package localnode joins the server's own machine to its cluster as a
// node. It is the server side of that node: it issues the node's
// credentials, installs what the node needs in the cluster (the OS
// admission policy, the local-path StorageClass and the provisioner's RBAC,
// the metrics.k8s.io registration, the MeshPeer API of every node's mesh),
// and supervises the agent-side processes (the runtime daemon and the
// node) with their typed role configs. What those processes do is the
// agent's (internal/agent, internal/runtime).
package localnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	goruntime "runtime"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/k3sm-dev/k3sm/internal/agent/dns"
	"github.com/k3sm-dev/k3sm/internal/agent/localpath"
	"github.com/k3sm-dev/k3sm/internal/agent/mesh"
	"github.com/k3sm-dev/k3sm/internal/agent/netpol"
	"github.com/k3sm-dev/k3sm/internal/agent/nodeproc"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/meshapi"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
)

// Addon joins the server's machine as a node: it issues the node's
// credentials (and the metrics API's serving certificate) and starts the
// runtime daemon early (they need only the data dir); it starts the node
// with the apiserver, held at its start gate; once authorization is
// verified it installs the node's RBAC (and the metrics scraper's) and
// opens the gate, while it installs the admission policy,
// the MeshPeer CRD and its policy (internal/server/meshapi), the storage
// class and the metrics reader role and Service; when the control plane is
// healthy it waits for the Node to be Ready, labels it, and registers the
// metrics APIService (so the aggregator's first check finds the node
// listening).
func Addon(log *slog.Logger) controlplane.Addon {
	if log == nil {
		log = slog.Default()
	}
	var (
		rt, n   *supervisor.Child
		admin   kubernetes.Interface
		dyn     dynamic.Interface
		agg     aggregator.Interface
		metrics metricsAPI
	)
	return controlplane.Addon{
		Early: func(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor) error {
			if err := issueCredentials(p); err != nil {
				return fmt.Errorf("node credentials: %w", err)
			}
			// The node's gate closes before the node starts: a gate left
			// by a killed server must not let it act before verification.
			if err := os.Remove(p.Layout.NodeStartGate()); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("node start gate: %w", err)
			}
			if p.Cfg.NodeInstant { // benchmark floor: no runtime, nothing to sample
				return nil
			}
			var err error
			rt, metrics, err = startRuntime(ctx, p, sup, log)
			return err
		},
		Starting: func(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor) error {
			rc, err := p.AdminConfig()
			if err != nil {
				return err
			}
			if admin, err = kubernetes.NewForConfig(rc); err != nil {
				return err
			}
			if agg, err = aggregator.NewForConfig(rc); err != nil {
				return err
			}
			if dyn, err = dynamic.NewForConfig(rc); err != nil {
				return err
			}
			// The node starts now, so its process start-up overlaps the
			// apiserver's; it waits at its gate, which Verified opens.
			args, err := roleconfig.Write(p.Layout.RoleConfig(roleconfig.Node), nodeConfig(p, metrics))
			if err != nil {
				return err
			}
			n, err = sup.Start(ctx, nodeproc.Node(p.Cfg.Executable, p.Cfg.DataDir, args, func(ctx context.Context) error {
				return nodeReady(ctx, admin, p.Cfg.NodeName)
			}))
			return err
		},
		Verified: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			// The node is on the critical path to "up": its gate opens as
			// soon as the RBAC its first lists need is in place, while the
			// objects it does not need to start are installed.
			var rbac, installs errgroup.Group
			rbac.Go(func() error {
				if err := localpath.EnsureRBAC(ctx, admin, localPathUser(p.Cfg.NodeName)); err != nil {
					return fmt.Errorf("local-path provisioner RBAC: %w", err)
				}
				return nil
			})
			// The node's Service proxy and DNS read Services and
			// EndpointSlices, which the Node authorizer does not grant.
			nodeUser := "system:node:" + p.Cfg.NodeName
			rbac.Go(func() error {
				if err := proxy.EnsureRBAC(ctx, admin, nodeUser); err != nil {
					return fmt.Errorf("service proxy RBAC: %w", err)
				}
				return nil
			})
			rbac.Go(func() error {
				if err := dns.EnsureRBAC(ctx, admin, nodeUser); err != nil {
					return fmt.Errorf("cluster DNS RBAC: %w", err)
				}
				return nil
			})
			rbac.Go(func() error {
				if err := netpol.EnsureRBAC(ctx, admin, nodeUser); err != nil {
					return fmt.Errorf("NetworkPolicy RBAC: %w", err)
				}
				return nil
			})
			rbac.Go(func() error {
				if err := mesh.EnsureRBAC(ctx, admin, nodeUser); err != nil {
					return fmt.Errorf("mesh RBAC: %w", err)
				}
				return nil
			})
			if metrics.port != 0 {
				// The metrics API lists the Nodes and pods as the scraper
				// as soon as the node starts.
				rbac.Go(func() error {
					if err := EnsureMetricsScraperRole(ctx, admin); err != nil {
						return fmt.Errorf("metrics scraper role: %w", err)
					}
					return nil
				})
			}
			installs.Go(func() error {
				if err := EnsureOSPolicy(ctx, admin, osOfNodes(), p.Cfg.NodeTaint); err != nil {
					return fmt.Errorf("admission policy: %w", err)
				}
				return nil
			})
			// Every node's MeshPeer: the CRD and the policy that keeps a
			// node to its own. The node waits for them to be served.
			installs.Go(func() error {
				return meshapi.Ensure(ctx, admin, dyn)
			})
			installs.Go(func() error {
				if err := localpath.EnsureStorageClass(ctx, admin); err != nil {
					return fmt.Errorf("local-path storage class: %w", err)
				}
				return nil
			})
			if metrics.port != 0 {
				installs.Go(func() error {
					if err := EnsureMetricsReaderRole(ctx, admin); err != nil {
						return fmt.Errorf("metrics reader role: %w", err)
					}
					if err := EnsureMetricsService(ctx, admin, metrics.port); err != nil {
						return fmt.Errorf("metrics service: %w", err)
					}
					return nil
				})
			}
			err := rbac.Wait()
			if err == nil && rt != nil {
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				err = rt.WaitReady(wctx)
				cancel()
			}
			if err == nil {
				err = openStartGate(p.Layout.NodeStartGate())
			}
			if werr := installs.Wait(); err == nil {
				err = werr
			}
			return err
		},
		Ready: func(ctx context.Context, p *controlplane.Plane, _ *supervisor.Supervisor) error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if err := n.WaitReady(wctx); err != nil {
				return err
			}
			// A node may not give itself a role label (NodeRestriction); the server does.
			patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":"true"}}}`)
			if _, err := admin.CoreV1().Nodes().Patch(ctx, p.Cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return err
			}
			if err := EnsureProviderTaint(ctx, admin, p.Cfg.NodeName, p.Cfg.NodeTaint); err != nil {
				return fmt.Errorf("node taint: %w", err)
			}
			if metrics.port == 0 {
				return nil
			}
			err := EnsureAPIService(ctx, agg, metrics.port, p.Certs.ServerCA.CertPEM())
			if err == errNotOurs {
				log.Warn("not serving metrics.k8s.io: APIService " + APIServiceName + " exists and is not managed by k3sm (an installed metrics-server?); delete it to use k3sm's")
				return nil
			}
			return err
		},
	}
}

// startRuntime starts k3sm-netd (with a pod network) and the runtime daemon,
// and prepares the metrics API the node will serve.
func startRuntime(ctx context.Context, p *controlplane.Plane, sup *supervisor.Supervisor, log *slog.Logger) (*supervisor.Child, metricsAPI, error) {
	metrics, err := prepareMetricsAPI(p)
	if err != nil {
		return nil, metrics, err
	}
	bin, err := nodeproc.RuntimedPath(p.Cfg.Executable)
	if err != nil {
		return nil, metrics, err
	}
	if p.Cfg.DNSConfig != "" {
		if _, err := dns.LoadForwardFile(p.Cfg.DNSConfig, p.Cfg.ClusterDomain); err != nil {
			return nil, metrics, fmt.Errorf("--dns-config: %w", err)
		}
	}
	rcfg := runtimeConfig(p)
	netns, reason, err := nodeproc.PodNetworkMode(p.Cfg.PodNetwork, goruntime.GOOS, os.Geteuid(), p.Cfg.NetdSocket)
	if err != nil {
		return nil, metrics, err
	}
	if p.Cfg.ServiceProxy == "nftables" && !netns {
		return nil, metrics, fmt.Errorf("--service-proxy=nftables: ClusterIPs in the kernel need k3sm-netd (%s); use --service-proxy=auto or userspace", reason)
	}
	if netns && p.Cfg.NetdSocket != "" {
		// Run apart, as root: the server only uses it.
		rcfg.NetdSocket = p.Cfg.NetdSocket
		rcfg.ServiceCIDR, rcfg.ClusterCIDR = p.Cfg.ServiceCIDR, p.Cfg.ClusterCIDR
	} else if netns {
		if err := nodeproc.StartNetd(ctx, sup, p.Cfg.Executable, p.Cfg.DataDir, p.Cfg.ClusterCIDR, p.Cfg.ServiceCIDR); err != nil {
			return nil, metrics, err
		}
		rcfg.NetdSocket = p.Layout.NetdSocket()
		rcfg.ServiceCIDR, rcfg.ClusterCIDR = p.Cfg.ServiceCIDR, p.Cfg.ClusterCIDR
	} else {
		rcfg.NoPodNetworkReason = reason
		log.Info("pod network off", "reason", reason)
	}
	args, err := roleconfig.Write(p.Layout.RoleConfig(roleconfig.Runtime), rcfg)
	if err != nil {
		return nil, metrics, err
	}
	rt, err := sup.Start(ctx, nodeproc.Runtime(bin, p.Cfg.DataDir, args))
	return rt, metrics, err
}

// openStartGate lets the node go on (roleconfig.NodeConfig.StartGate):
// called only once authorization is verified.
func openStartGate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("node start gate: %w", err)
	}
	return f.Close()
}

// runtimeConfig is what the runtime daemon runs with.
func runtimeConfig(p *controlplane.Plane) roleconfig.RuntimeConfig {
	return roleconfig.RuntimeConfig{DataDir: p.Cfg.DataDir, Socket: p.Layout.RuntimeSocket(),
		RegistriesFile: p.Cfg.RegistriesConfig, MaxPods: int64(p.Cfg.MaxPods), RegistryPort: p.Cfg.RegistryPort, Disk: p.Cfg.Disk,
		KeepCgroupAttachMode: !p.Cfg.CgroupFavorDynMods, PodPidsLimit: p.Cfg.PodMaxPids}
}

// nodeConfig is what the node runs with.
func nodeConfig(p *controlplane.Plane, m metricsAPI) roleconfig.NodeConfig {
	cfg, l := p.Cfg, p.Layout
	nc := roleconfig.NodeConfig{
		Name: cfg.NodeName, IP: cfg.NodeIP, KubeletPort: cfg.KubeletPort,
		Kubeconfig: l.NodeKubeconfig(), ServingCert: l.KubeletServingCert(), ServingKey: l.KubeletServingKey(),
		ClientCAFile: l.KubeletClientCA(), RuntimeSocket: l.RuntimeSocket(), DataDir: cfg.DataDir,
		LocalPathKubeconfig: l.LocalPathKubeconfig(), LocalPathDir: l.StorageDir(),
		Instant: cfg.NodeInstant, InstantWrites: cfg.NodeInstantWrites, Taint: cfg.NodeTaint, Metrics: m.serveConfig(p), Disk: cfg.Disk, StartGate: l.NodeStartGate(),
		ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain, DNSConfig: cfg.DNSConfig, APIServiceIP: apiServiceIP(cfg.ServiceCIDR),
		ServiceCIDR: cfg.ServiceCIDR, ClusterCIDR: cfg.ClusterCIDR,
	}
	netd := l.NetdSocket()
	if cfg.NetdSocket != "" {
		netd = cfg.NetdSocket
	}
	if cfg.MeshPort != 0 {
		if netns, _, err := nodeproc.PodNetworkMode(cfg.PodNetwork, goruntime.GOOS, os.Geteuid(), cfg.NetdSocket); err == nil && netns {
			nc.Mesh = roleconfig.MeshConfig{Port: cfg.MeshPort, NetdSocket: netd}
		}
	}
	if controlplane.ServiceProxyMode(cfg.ServiceProxy, goruntime.GOOS, cfg.NetdAvailable(os.Geteuid()), cfg.PodNetwork) == "nftables" {
		nc.NetdSocket = l.NetdSocket()
		if cfg.NetdSocket != "" {
			nc.NetdSocket = cfg.NetdSocket
		}
	}
	return nc
}

// apiServiceIP is the kubernetes Service's ClusterIP ("" if the range does
// not parse, which the config check refused already).
func apiServiceIP(serviceCIDR string) string {
	ip, err := controlplane.APIServiceIP(serviceCIDR)
	if err != nil {
		return ""
	}
	return ip.String()
}

// nodeReady: the Node object exists and reports Ready.
func nodeReady(ctx context.Context, admin kubernetes.Interface, name string) error {
	node, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s is not Ready", node.Name)
}
