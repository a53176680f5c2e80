package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// DisabledControllers are switched off because they assume a Linux kubelet
// with attachable volumes underneath; see docs/k3sm.md for the full reasoning.
var DisabledControllers = []string{"persistentvolume-attach-detach-controller"}

// EnabledExtraControllers are off upstream by default but needed for node join.
var EnabledExtraControllers = []string{"bootstrap-signer-controller", "token-cleaner-controller"}

// KineSQLiteParams are the SQLite settings kine opens the datastore with: WAL
// so readers never block the writer, NORMAL sync (durable across process
// crashes, which is what kill -9 recovery needs), a long busy timeout.
const KineSQLiteParams = "_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&_stmt_cache_size=20"

// Plane holds the resolved inputs every component is built from.
type Plane struct {
	Cfg    *Config
	Layout datadir.Layout
	Certs  *Certs
	// Serving certs of the scheduler and controller-manager health endpoints.
	SchedulerServing, ControllerManagerServing pki.Leaf
}

// NewPlane prepares PKI and the serving certs of the loopback health endpoints.
func NewPlane(cfg *Config) (*Plane, error) {
	certs, err := EnsurePKI(cfg)
	if err != nil {
		return nil, fmt.Errorf("PKI: %w", err)
	}
	p := &Plane{Cfg: cfg, Layout: datadir.New(cfg.DataDir), Certs: certs}
	local := pki.LeafSpec{DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true}
	local.CommonName = "kube-scheduler"
	if p.SchedulerServing, err = certs.ServerCA.Ensure(p.Layout.TLSDir(), "serving-kube-scheduler", local); err != nil {
		return nil, err
	}
	local.CommonName = "kube-controller-manager"
	if p.ControllerManagerServing, err = certs.ServerCA.Ensure(p.Layout.TLSDir(), "serving-kube-controller-manager", local); err != nil {
		return nil, err
	}
	return p, nil
}

// APIServer writes kine's role config and returns the component of the
// process that serves both kine and the kube-apiserver
// (roleconfig.KineFlag); Controllers follows it in start order.
func (p *Plane) APIServer() (supervisor.Component, error) {
	l := p.Layout
	ds := p.Cfg.Datastore
	if ds.Kind() == datastore.Etcd {
		// The apiserver speaks to etcd itself: no kine.
		return apiserver{p, ""}, nil
	}
	kc := roleconfig.KineConfig{Listen: "unix://" + l.KineSocketName(), Endpoint: "sqlite://" + l.DBFile() + "?" + KineSQLiteParams}
	if ds.External() {
		kc.Endpoint, kc.CAFile, kc.CertFile, kc.KeyFile = ds.Endpoint, ds.CAFile, ds.CertFile, ds.KeyFile
	}
	path := l.RoleConfig(roleconfig.Kine)
	if _, err := roleconfig.Write(path, kc); err != nil {
		return nil, err
	}
	return apiserver{p, path}, nil
}

// Controllers writes the scheduler's configuration file and the role
// config of the process that runs the scheduler and the controller-manager
// (roleconfig.Controllers), and returns its component.
func (p *Plane) Controllers() (supervisor.Component, error) {
	sched, err := p.SchedulerArgs()
	if err != nil {
		return nil, err
	}
	sched, cm := shareProcessFlags(sched, controllerManager{p}.Args())
	args, err := roleconfig.Write(p.Layout.RoleConfig(roleconfig.Controllers), roleconfig.ControllersConfig{Scheduler: sched, ControllerManager: cm})
	if err != nil {
		return nil, err
	}
	return controllers{p, args}, nil
}

// apiserver is the kube-apiserver's process, which serves kine (the
// config at kineConfig) first; with an external etcd there is no kine.
type apiserver struct {
	p          *Plane
	kineConfig string
}

func (a apiserver) Name() string { return roleconfig.APIServer }

// Args is the kube-apiserver command line.
func (a apiserver) Args() []string {
	cfg, c := a.p.Cfg, a.p.Certs
	issuer := "https://kubernetes.default.svc." + cfg.ClusterDomain
	args := []string{
		"--advertise-address=" + cfg.AdvertiseAddress,
		"--bind-address=" + cfg.BindAddress,
		fmt.Sprintf("--secure-port=%d", cfg.HTTPSPort),
		"--storage-backend=etcd3",
		"--allow-privileged=true",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth=true",
		"--anonymous-auth=false",
		"--profiling=false",
		"--client-ca-file=" + c.ClientCA.CertPath,
		"--tls-cert-file=" + c.Serving.CertPath,
		"--tls-private-key-file=" + c.Serving.KeyPath,
		"--kubelet-certificate-authority=" + c.ServerCA.CertPath,
		"--kubelet-client-certificate=" + c.KubeletClient.CertPath,
		"--kubelet-client-key=" + c.KubeletClient.KeyPath,
		"--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
		"--requestheader-client-ca-file=" + c.RequestHeaderCA.CertPath,
		"--requestheader-allowed-names=" + AuthProxyUser,
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file=" + c.AuthProxy.CertPath,
		"--proxy-client-key-file=" + c.AuthProxy.KeyPath,
		"--service-account-issuer=" + issuer,
		"--api-audiences=" + issuer,
		"--service-account-key-file=" + c.ServiceAccountKey,
		"--service-account-signing-key-file=" + c.ServiceAccountKey,
		"--service-cluster-ip-range=" + cfg.ServiceCIDR,
	}
	if ds := cfg.Datastore; ds.Kind() == datastore.Etcd {
		args = append(args, "--etcd-servers="+strings.Join(ds.EtcdEndpoints(), ","))
		for _, f := range [][2]string{{"--etcd-cafile=", ds.CAFile}, {"--etcd-certfile=", ds.CertFile}, {"--etcd-keyfile=", ds.KeyFile}} {
			if f[1] != "" {
				args = append(args, f[0]+f[1])
			}
		}
	} else {
		args = append(args, "--etcd-servers=unix://"+a.p.Layout.KineSocketName())
	}
	if ops := cfg.Ops; ops.EncryptionProviderConfig != "" {
		args = append(args, "--encryption-provider-config="+ops.EncryptionProviderConfig,
			"--encryption-provider-config-automatic-reload=true")
	}
	if ops := cfg.Ops; ops.AuditPolicyFile != "" {
		args = append(args, "--audit-policy-file="+ops.AuditPolicyFile, "--audit-log-path="+ops.AuditLog,
			"--audit-log-maxsize=100", "--audit-log-maxbackup=10", "--audit-log-maxage=30")
	}
	// The default endpoint reconciler refuses a loopback advertise address;
	// on a single loopback-only machine nothing else needs to reach it.
	if ip, err := netip.ParseAddr(cfg.AdvertiseAddress); err == nil && ip.IsLoopback() {
		args = append(args, "--endpoint-reconciler-type=none")
	}
	return withExtraArgs(args, cfg.ExtraArgs[roleconfig.APIServer])
}

func (a apiserver) Command() supervisor.Command {
	args := []string{roleconfig.APIServer}
	if a.kineConfig != "" {
		args = append(args, roleconfig.KineFlag+a.kineConfig)
	}
	args = append(args, a.Args()...)
	return supervisor.Command{Path: a.p.Cfg.Executable, Args: args, Dir: a.p.Layout.ServerDir(), Settle: true}
}

func (a apiserver) Ready(ctx context.Context) error {
	return a.p.probe(ctx, a.p.Cfg.LocalAPIURL()+"/readyz", true)
}

// schedulerQPS is the scheduler's client rate limit: upstream's 50
// requests/s paces a burst of pods (a binding and an Event each). One
// local apiserver serves it.
const schedulerQPS = 200

// schedulerConfig is a KubeSchedulerConfiguration (JSON, which the
// scheduler reads as YAML): the client settings have no flags but
// deprecated ones, which a configuration file overrides anyway.
// leaderElect is on when several servers may share the cluster (an
// external datastore): then one scheduler acts at a time.
func schedulerConfig(kubeconfig string, leaderElect bool) []byte {
	cfg := map[string]any{
		"apiVersion": "kubescheduler.config.k8s.io/v1",
		"kind":       "KubeSchedulerConfiguration",
		"clientConnection": map[string]any{
			"kubeconfig": kubeconfig, "qps": schedulerQPS, "burst": 2 * schedulerQPS,
		},
		"leaderElection":            map[string]any{"leaderElect": leaderElect},
		"enableProfiling":           false,
		"enableContentionProfiling": false,
	}
	data, _ := json.MarshalIndent(cfg, "", "  ") // maps of strings, numbers and booleans
	return append(data, '\n')
}

// SchedulerArgs writes the scheduler's configuration file and returns its
// command line.
func (p *Plane) SchedulerArgs() ([]string, error) {
	path := p.Layout.RoleConfig(roleconfig.Scheduler)
	if err := atomicfile.WriteFile(path, schedulerConfig(p.Layout.Cred("scheduler"), p.Cfg.LeaderElect()), 0o600); err != nil {
		return nil, fmt.Errorf("kube-scheduler configuration: %w", err)
	}
	kc := p.Layout.Cred("scheduler")
	return withExtraArgs([]string{
		"--config=" + path,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.Cfg.SchedulerPort),
		"--tls-cert-file=" + p.SchedulerServing.CertPath,
		"--tls-private-key-file=" + p.SchedulerServing.KeyPath,
	}, p.Cfg.ExtraArgs[roleconfig.Scheduler]), nil
}

// LeaderElect says whether the scheduler and controller-manager elect a
// leader: on an external datastore, where several servers may run them
// (one acts at a time); a SQLite cluster has one server, which then
// starts acting without waiting for a lease.
func (c *Config) LeaderElect() bool { return c.Datastore.External() }

type controllerManager struct{ p *Plane }

// controllerManagerQPS is the controller-manager's client rate limit. One
// local apiserver serves it; the limit only guards against a runaway loop.
const controllerManagerQPS = 200

// Args is the kube-controller-manager command line.
func (c controllerManager) Args() []string {
	cfg, certs, l := c.p.Cfg, c.p.Certs, c.p.Layout
	kc := l.Cred("controller-manager")
	controllers := []string{"*"}
	controllers = append(controllers, EnabledExtraControllers...)
	for _, d := range DisabledControllers {
		controllers = append(controllers, "-"+d)
	}
	return withExtraArgs([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", cfg.ControllerManagerPort),
		"--tls-cert-file=" + c.p.ControllerManagerServing.CertPath,
		"--tls-private-key-file=" + c.p.ControllerManagerServing.KeyPath,
		fmt.Sprintf("--leader-elect=%t", cfg.LeaderElect()),
		"--profiling=false",
		"--controllers=" + strings.Join(controllers, ","),
		// Its default of 20 requests/s throttles start-up on a fresh
		// datastore: every controller first gets its own ServiceAccount and
		// token (below), ~3 requests each, before it lists what it watches.
		fmt.Sprintf("--kube-api-qps=%d", controllerManagerQPS),
		fmt.Sprintf("--kube-api-burst=%d", 2*controllerManagerQPS),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + certs.ServiceAccountKey,
		"--root-ca-file=" + certs.ServerCA.CertPath,
		"--cluster-signing-kube-apiserver-client-cert-file=" + certs.ClientCA.CertPath,
		"--cluster-signing-kube-apiserver-client-key-file=" + certs.ClientCA.KeyPath,
		"--cluster-signing-kubelet-client-cert-file=" + certs.ClientCA.CertPath,
		"--cluster-signing-kubelet-client-key-file=" + certs.ClientCA.KeyPath,
		"--cluster-signing-kubelet-serving-cert-file=" + certs.ServerCA.CertPath,
		"--cluster-signing-kubelet-serving-key-file=" + certs.ServerCA.KeyPath,
		"--cluster-signing-legacy-unknown-cert-file=" + certs.ServerCA.CertPath,
		"--cluster-signing-legacy-unknown-key-file=" + certs.ServerCA.KeyPath,
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + cfg.ClusterCIDR,
		fmt.Sprintf("--node-cidr-mask-size-ipv4=%d", NodeCIDRMaskSize(cfg.MaxPods)),
		"--service-cluster-ip-range=" + cfg.ServiceCIDR,
		"--flex-volume-plugin-dir=" + l.FlexVolumeDir(),
	}, cfg.ExtraArgs[roleconfig.ControllerManager])
}

// controllers is kube-scheduler and kube-controller-manager in one process:
// ready when both answer their /healthz.
type controllers struct {
	p    *Plane
	args []string
}

func (c controllers) Name() string { return roleconfig.Controllers }
func (c controllers) Command() supervisor.Command {
	return supervisor.Command{Path: c.p.Cfg.Executable, Args: append([]string{roleconfig.Controllers}, c.args...), Dir: c.p.Layout.ServerDir(), Settle: true}
}
func (c controllers) Ready(ctx context.Context) error {
	for _, port := range []int{c.p.Cfg.SchedulerPort, c.p.Cfg.ControllerManagerPort} {
		if err := c.p.probe(ctx, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), false); err != nil {
			return err
		}
	}
	return nil
}

// probe GETs url over TLS verified against the server CA, optionally as admin.
func (p *Plane) probe(ctx context.Context, url string, asAdmin bool) error {
	pool := x509.NewCertPool()
	pool.AddCert(p.Certs.ServerCA.Cert)
	tc := &tls.Config{RootCAs: pool}
	if asAdmin {
		pair, err := tls.LoadX509KeyPair(p.Certs.Admin.CertPath, p.Certs.Admin.KeyPath)
		if err != nil {
			return err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
