// Package agent runs `k3sm agent`: a machine that joins a server's cluster
// as a node. It joins through internal/agent/join (again at every start,
// so renewed settings and certificates arrive), then supervises the same
// processes the server's own node runs (internal/agent/nodeproc: k3sm-netd
// as root, k3sm-runtimed, the node role) with the settings the join
// returned. Nothing of the server side is linked here.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/apilb"
	"github.com/k3sm-dev/k3sm/internal/agent/join"
	"github.com/k3sm-dev/k3sm/internal/agent/nodeproc"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is what `k3sm agent` runs with.
type Config struct {
	// Server is the server's join endpoint (https://HOST:9345); Token a
	// join token from `k3sm token create` there.
	Server, Token string
	NodeName      string
	// NodeIP is this node's address (default: the one this machine
	// reaches the server from).
	NodeIP      string
	DataDir     string
	KubeletPort int
	// MeshPort is the UDP port of this node's WireGuard mesh device (0: no
	// mesh: pods here reach no other node's pods).
	MeshPort   int
	MaxPods    int
	PodMaxPids int64
	// PodNetwork is auto, netns or host, as the server's --pod-network.
	PodNetwork string
	NodeTaint  bool
	Disk       diskpolicy.Config
	// NetdSocket is a k3sm-netd run apart, as root (k3sm install's netd
	// unit), which serves this agent's uid: the agent itself then needs no
	// privilege. "": the agent starts k3sm-netd itself (as root).
	NetdSocket string
	// LBPort is the loopback port of the agent's load balancer over the
	// cluster's apiservers, which the node's clients dial (k3s's
	// --lb-server-port).
	LBPort int
	// Executable is k3sm itself: the node role, with k3sm-runtimed and
	// k3sm-netd beside it.
	Executable string
}

// DefaultLBPort is k3s's agent load balancer port.
const DefaultLBPort = 6444

// Validate checks the flags, naming the one at fault and the fix.
func (c *Config) Validate() error {
	var errs []error
	if _, err := join.ParseServer(c.Server); err != nil {
		errs = append(errs, err)
	}
	if c.Token == "" {
		errs = append(errs, errors.New("--token: required: run `k3sm token create` on the server and pass its last line"))
	} else if _, err := joinv1.ParseToken(c.Token); err != nil {
		errs = append(errs, err)
	}
	if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--node-name %q: %v; use lowercase letters, digits, '-' and '.'", c.NodeName, msgs))
	}
	if c.NodeIP != "" && net.ParseIP(c.NodeIP) == nil {
		errs = append(errs, fmt.Errorf("--node-ip %q: not an IP address", c.NodeIP))
	}
	if c.KubeletPort < 1 || c.KubeletPort > 65535 {
		errs = append(errs, fmt.Errorf("--kubelet-port %d: not a TCP port", c.KubeletPort))
	}
	if c.MeshPort < 0 || c.MeshPort > 65535 {
		errs = append(errs, fmt.Errorf("--mesh-port %d: not a UDP port; use 1 to 65535 (default 51820), or 0 for no mesh", c.MeshPort))
	}
	if c.LBPort < 1 || c.LBPort > 65535 || c.LBPort == c.KubeletPort {
		errs = append(errs, fmt.Errorf("--lb-server-port %d: not a free TCP port of this node; use 1 to 65535 (default %d), not the kubelet's", c.LBPort, DefaultLBPort))
	}
	if c.MaxPods < 1 {
		errs = append(errs, fmt.Errorf("--max-pods %d: must be at least 1", c.MaxPods))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: must not be empty"))
	}
	if c.NetdSocket != "" && !filepath.IsAbs(c.NetdSocket) {
		errs = append(errs, fmt.Errorf("--netd-socket %q: not an absolute path; give the socket k3sm-netd serves, e.g. /run/k3sm/netd.sock", c.NetdSocket))
	}
	if c.NetdSocket != "" && c.PodNetwork == "host" {
		errs = append(errs, fmt.Errorf("--netd-socket %s: given with --pod-network=host, which uses no k3sm-netd; drop one of them", c.NetdSocket))
	}
	return errors.Join(errs...)
}

// Run joins and runs the node until ctx ends; pods keep running after it
// (the next start re-attaches to them).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	l := datadir.New(cfg.DataDir)
	for _, d := range []string{cfg.DataDir, l.LogDir(), l.RunDir(), l.AgentDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
		}
	}
	release, err := datadir.Lock(l.LockFile(), "agent")
	if err != nil {
		return fmt.Errorf("--data-dir %s: %w: stop it first, or pass another --data-dir", cfg.DataDir, err)
	}
	defer release()
	tok, _ := joinv1.ParseToken(cfg.Token)
	if cfg.NodeIP == "" {
		ip, err := sourceAddr(cfg.Server)
		if err != nil {
			return fmt.Errorf("--node-ip: not given, and %v; pass the address the servers reach this node on", err)
		}
		cfg.NodeIP = ip.String()
	}
	// The node's clients reach the apiservers through the balancer, so
	// that losing one server disconnects none of them: the join names it
	// in the node's kubeconfigs, and it listens once the join has listed
	// the servers.
	lbAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.LBPort))
	settings, err := joinWithRetry(ctx, cfg, tok, "https://"+lbAddr, log)
	if err != nil {
		return err
	}
	lb, err := apilb.New(apilb.Options{Listen: lbAddr, Servers: hostPorts(settings.Servers), StateFile: l.APIServersFile(),
		Log: log.With("component", "apiserver-lb")})
	if err != nil {
		return fmt.Errorf("--lb-server-port %d: %w", cfg.LBPort, err)
	}
	go func() {
		if err := lb.Run(ctx); err != nil {
			log.Error("apiserver load balancer stopped", "err", err)
		}
	}()
	sup, err := supervisor.New(l.LogDir(), log)
	if err != nil {
		return err
	}
	defer sup.StopAll()
	if err := start(ctx, cfg, settings, sup, log); err != nil {
		return err
	}
	if rc, err := clientcmd.BuildConfigFromFlags("", l.NodeKubeconfig()); err == nil {
		if cs, err := kubernetes.NewForConfig(rc); err == nil {
			go apilb.Follow(ctx, cs, lb)
		}
	}
	log.Info("k3sm agent is up", "node", cfg.NodeName, "servers", lb.Servers())
	<-ctx.Done()
	return nil
}

// joinWithRetry joins; while the server cannot be reached it retries with
// back-off, and a node that joined before starts with what it has (a
// server restart must not stop an agent that restarts meanwhile). A
// refusal is final: it says what to do.
func joinWithRetry(ctx context.Context, cfg Config, tok joinv1.Token, api string, log *slog.Logger) (*joinv1.ClusterSettings, error) {
	delay := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second}
	l := datadir.New(cfg.DataDir)
	for {
		resp, err := join.Join(ctx, join.Options{Server: cfg.Server, Token: tok, NodeName: cfg.NodeName,
			NodeIPs: []net.IP{net.ParseIP(cfg.NodeIP)}, DataDir: cfg.DataDir, APIServer: api})
		if err == nil {
			log.Info("joined", "server", cfg.Server, "node", cfg.NodeName)
			return &resp.Cluster, nil
		}
		var refused *joinv1.Error
		if errors.As(err, &refused) || !join.Retryable(err) {
			return nil, err
		}
		if s, lerr := loadSettings(l.JoinFile()); lerr == nil {
			log.Warn("the server's join endpoint cannot be reached; starting with the credentials of the last join", "err", err)
			return s, nil
		}
		log.Warn("cannot join yet; retrying", "server", cfg.Server, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay.Next()):
		}
	}
}

func loadSettings(path string) (*joinv1.ClusterSettings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s joinv1.ClusterSettings
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	if len(s.Servers) == 0 {
		return nil, errors.New("no servers")
	}
	return &s, nil
}

// start runs netd (with a pod network), the runtime daemon and the node,
// and waits for the Node to be Ready.
func start(ctx context.Context, cfg Config, s *joinv1.ClusterSettings, sup *supervisor.Supervisor, log *slog.Logger) error {
	l := datadir.New(cfg.DataDir)
	netns, reason, err := nodeproc.PodNetworkMode(cfg.PodNetwork, goruntime.GOOS, os.Geteuid(), cfg.NetdSocket)
	if err != nil {
		return err
	}
	rcfg := roleconfig.RuntimeConfig{DataDir: cfg.DataDir, Socket: l.RuntimeSocket(), MaxPods: int64(cfg.MaxPods),
		Disk: cfg.Disk, PodPidsLimit: cfg.PodMaxPids}
	ncfg := roleconfig.NodeConfig{
		Name: cfg.NodeName, IP: cfg.NodeIP, KubeletPort: cfg.KubeletPort,
		Kubeconfig: l.NodeKubeconfig(), ServingCert: l.KubeletServingCert(), ServingKey: l.KubeletServingKey(),
		ClientCAFile: l.KubeletClientCA(), RuntimeSocket: l.RuntimeSocket(), DataDir: cfg.DataDir,
		Taint: cfg.NodeTaint, Disk: cfg.Disk,
		ClusterDNS: s.ClusterDNS, ClusterDomain: s.ClusterDomain, APIServiceIP: s.APIServiceIP,
		ServiceCIDR: s.ServiceCIDR, ClusterCIDR: s.ClusterCIDR,
	}
	// The node's local-path provisioner, with its own credential from
	// the join: volumes of claims scheduled here are made here.
	if _, err := os.Stat(l.LocalPathKubeconfig()); err == nil {
		ncfg.LocalPathKubeconfig, ncfg.LocalPathDir = l.LocalPathKubeconfig(), l.StorageDir()
	}
	if netns {
		netd := cfg.NetdSocket
		if netd == "" {
			if err := nodeproc.StartNetd(ctx, sup, cfg.Executable, cfg.DataDir, s.ClusterCIDR, s.ServiceCIDR); err != nil {
				return err
			}
			netd = l.NetdSocket()
		}
		rcfg.NetdSocket, rcfg.ServiceCIDR, rcfg.ClusterCIDR = netd, s.ServiceCIDR, s.ClusterCIDR
		ncfg.NetdSocket = netd
		if cfg.MeshPort != 0 {
			ncfg.Mesh = roleconfig.MeshConfig{Port: cfg.MeshPort, NetdSocket: netd}
		}
	} else {
		rcfg.NoPodNetworkReason = reason
		log.Info("pod network off", "reason", reason)
	}
	bin, err := nodeproc.RuntimedPath(cfg.Executable)
	if err != nil {
		return err
	}
	args, err := roleconfig.Write(l.RoleConfig(roleconfig.Runtime), rcfg)
	if err != nil {
		return err
	}
	rt, err := sup.Start(ctx, nodeproc.Runtime(bin, cfg.DataDir, args))
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = rt.WaitReady(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("runtime daemon: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", l.NodeKubeconfig())
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if args, err = roleconfig.Write(l.RoleConfig(roleconfig.Node), ncfg); err != nil {
		return err
	}
	n, err := sup.Start(ctx, nodeproc.Node(cfg.Executable, cfg.DataDir, args, func(ctx context.Context) error {
		node, err := cs.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s is not Ready", cfg.NodeName)
	}))
	if err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := n.WaitReady(wctx); err != nil {
		return fmt.Errorf("node %s did not become Ready: %w (see %s)", cfg.NodeName, err, l.LogDir())
	}
	return nil
}

// hostPorts are the servers' URLs as the balancer's host:port.
func hostPorts(urls []string) []string {
	var hp []string
	for _, s := range urls {
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			hp = append(hp, u.Host)
		}
	}
	return hp
}

// sourceAddr is the local address this machine reaches the server from: a
// UDP "connection" picks the route and sends nothing.
func sourceAddr(server string) (net.IP, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	c, err := net.Dial("udp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("no route to %s: %w", u.Host, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}
