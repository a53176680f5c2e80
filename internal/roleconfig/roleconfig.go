// Package roleconfig owns the contract between the supervisor and the
// children it runs from the same binary: the names of the hidden roles
// (`k3sm <role> ...`) and, for k3sm's own roles, one typed configuration
// each. The server writes it as JSON under the data dir's run/ and starts
// the child with `--config=<file>`; the child decodes the same type,
// refusing fields it does not know. Adding a field is one change here.
// The upstream components keep their own command lines.
package roleconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
)

// Hidden roles of the k3sm binary: its first argument when the supervisor
// re-executes it.
const (
	Kine              = "kine"
	APIServer         = "kube-apiserver"
	Scheduler         = "kube-scheduler"
	ControllerManager = "kube-controller-manager"
	// Controllers runs kube-scheduler and kube-controller-manager in one
	// process (ControllersConfig): each process of the big binary costs
	// ~14 MiB of package initialisation alone (bench/RESULTS.md).
	Controllers = "kube-controllers"
	Runtime     = "runtimed"
	Node        = "node"
	// Etcd is the embedded etcd member of a server started with
	// --cluster-init, or joined to such a cluster (EtcdConfig).
	Etcd = "etcd"
	// Netd is k3sm-netd, the root network helper: a binary of its own
	// (`k3sm-netd --config=<file>`), not a role of the k3sm binary.
	Netd = netdconfig.Role
)

// NetdConfig is k3sm-netd's configuration; it lives in netdconfig so the
// root helper reads it without linking this package.
type NetdConfig = netdconfig.Config

// KineConfig is the datastore role.
type KineConfig struct {
	// Listen is where kine serves the etcd API (unix://kine.sock, relative
	// to the working directory to keep the socket path short).
	Listen string `json:"listen"`
	// Endpoint is the datastore: sqlite://path?params, or an external
	// postgres:// or mysql:// database (--datastore-endpoint).
	Endpoint string `json:"endpoint"`
	// CAFile, CertFile, KeyFile: TLS to an external database.
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

// EtcdConfig is the embedded etcd member: one per server of a cluster
// made with --cluster-init, mutual TLS from the cluster's etcd CA on both
// its client and its peer port.
type EtcdConfig struct {
	// Name is the member's name (the server's node name).
	Name    string `json:"name"`
	DataDir string `json:"dataDir"`
	// ListenClient and ListenPeer are https URLs; AdvertiseClient and
	// AdvertisePeer what the other members and servers dial.
	ListenClient    []string `json:"listenClient"`
	AdvertiseClient []string `json:"advertiseClient"`
	ListenPeer      []string `json:"listenPeer"`
	AdvertisePeer   []string `json:"advertisePeer"`
	// InitialCluster is name=peerURL,...; ClusterState "new" (the first
	// server) or "existing" (a member added to a running cluster). Both
	// matter only on the member's first start.
	InitialCluster string `json:"initialCluster"`
	ClusterState   string `json:"clusterState"`
	// CertFile and KeyFile serve both ports and authenticate the member
	// to its peers; TrustedCAFile (the etcd CA) is what every client and
	// peer certificate must be signed by.
	CertFile      string `json:"certFile"`
	KeyFile       string `json:"keyFile"`
	TrustedCAFile string `json:"trustedCAFile"`
}

// KineFlag, as the first argument of the APIServer role, names a
// KineConfig file: that process serves kine on the config's socket before
// the upstream command starts, and stops it after the command returns. One
// process less than a kine child (each process of the big binary costs
// ~14 MiB of package initialisation); the Kine role still runs it alone.
const KineFlag = "--k3sm-kine-config="

// SplitKine returns the KineConfig file named by an APIServer command line
// that starts with KineFlag ("" if it does not), and the upstream
// arguments after it.
func SplitKine(args []string) (path string, upstream []string) {
	if len(args) > 0 && strings.HasPrefix(args[0], KineFlag) {
		return strings.TrimPrefix(args[0], KineFlag), args[1:]
	}
	return "", args
}

// ReadFile decodes a role's configuration file into cfg, refusing fields
// it does not know.
func ReadFile(role, path string, cfg any) error {
	return Read(role, []string{"--config=" + path}, cfg)
}

// ControllersConfig is the Controllers role: the command line of each
// upstream component, without its name.
type ControllersConfig struct {
	Scheduler         []string `json:"scheduler"`
	ControllerManager []string `json:"controllerManager"`
}

// ProcessFlags are the flags of kube-scheduler and kube-controller-manager
// that set process-wide state (klog, the feature gates, the emulated
// version): sharing a process, both must be given the same values. The
// Controllers role refuses to start if upstream has one not listed here.
var ProcessFlags = []string{
	"feature-gates", "emulated-version", "min-compatibility-version",
	"v", "vmodule", "logging-format", "log-flush-frequency",
	"log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size",
}

// RuntimeConfig is the runtime daemon role.
type RuntimeConfig struct {
	DataDir        string `json:"dataDir"`
	Socket         string `json:"socket"`
	RegistriesFile string `json:"registriesFile,omitempty"`
	MaxPods        int64  `json:"maxPods"`
	// RegistryPort serves the node-local registry on 127.0.0.1 (0: off).
	RegistryPort int `json:"registryPort,omitempty"`
	// Disk: container log rotation is the runtime's part of it.
	Disk diskpolicy.Config `json:"disk"`
	// NetdSocket is k3sm-netd's socket, when pods get a network of their
	// own; otherwise NoPodNetworkReason says why they share the node's.
	NetdSocket         string `json:"netdSocket,omitempty"`
	NoPodNetworkReason string `json:"noPodNetworkReason,omitempty"`
	// ServiceCIDR and ClusterCIDR are the cluster's ranges, for netd.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// KeepCgroupAttachMode leaves the host's cgroup2 favordynmods as it is
	// (--cgroup-favordynmods=false).
	KeepCgroupAttachMode bool `json:"keepCgroupAttachMode,omitempty"`
	// PodPidsLimit caps each pod's tasks (--pod-max-pids): 0 the runtime's
	// default, -1 none.
	PodPidsLimit int64 `json:"podPidsLimit,omitempty"`
}

// NodeConfig is the node role: the Virtual Kubelet of this machine.
type NodeConfig struct {
	Name        string `json:"name"`
	IP          string `json:"ip"`
	KubeletPort int    `json:"kubeletPort"`
	// Kubeconfig is the node's own system:node:<name> credential.
	Kubeconfig string `json:"kubeconfig"`
	// ServingCert and ServingKey serve the kubelet API; ClientCAFile is the
	// CA of the clients it accepts (the apiserver).
	ServingCert   string `json:"servingCert"`
	ServingKey    string `json:"servingKey"`
	ClientCAFile  string `json:"clientCAFile"`
	RuntimeSocket string `json:"runtimeSocket"`
	// DataDir is k3sm's data directory: never allowed as a hostPath.
	DataDir string `json:"dataDir"`
	// LocalPathKubeconfig, when set, runs the node's local-path provisioner,
	// making volumes under LocalPathDir.
	LocalPathKubeconfig string `json:"localPathKubeconfig,omitempty"`
	LocalPathDir        string `json:"localPathDir,omitempty"`
	// Instant is the benchmark floor: pods are marked Running, nothing starts.
	Instant bool `json:"instant,omitempty"`
	// InstantWrites is the fair floor: with Instant, the node makes the API
	// writes a real start makes (token, Events, two statuses).
	InstantWrites bool `json:"instantWrites,omitempty"`
	// Taint registers the node with the provider taint (k3sm.io/provider=native:NoSchedule).
	Taint bool `json:"taint,omitempty"`
	// Services: with a pod network, the node serves the Service proxy and
	// cluster DNS on ClusterDNS (zone ClusterDomain, per-domain forwards
	// from DNSConfig), and pods reach the API through APIServiceIP (the
	// kubernetes Service).
	ClusterDNS    string `json:"clusterDNS,omitempty"`
	ClusterDomain string `json:"clusterDomain,omitempty"`
	DNSConfig     string `json:"dnsConfig,omitempty"`
	APIServiceIP  string `json:"apiServiceIP,omitempty"`
	// ServiceCIDR and ClusterCIDR are the cluster's ranges: the cluster DNS
	// answers their reverse names itself instead of forwarding them, and
	// the Service proxy serves no externalIP inside the pod range.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// NetdSocket, when set, is k3sm-netd's socket: the Service proxy puts
	// ClusterIPs in the kernel through it (--service-proxy).
	NetdSocket string `json:"netdSocket,omitempty"`
	// Mesh, when its Port is set, joins this node to the cluster's
	// WireGuard mesh (internal/agent/mesh) through k3sm-netd.
	Mesh MeshConfig `json:"mesh,omitempty"`
	// Metrics is the metrics.k8s.io API the node serves (off when Addr is empty).
	Metrics MetricsAPI `json:"metrics"`
	// Disk: image GC and DiskPressure are the node's part of it.
	Disk diskpolicy.Config `json:"disk"`
	// StartGate, when set, is a file the server creates once it has
	// verified authorization: the node may be started before, to get its
	// process going while the apiserver starts, but until the file exists
	// it neither uses the API nor touches its pods.
	StartGate string `json:"startGate,omitempty"`
}

// MeshConfig is the node's part in the WireGuard mesh.
type MeshConfig struct {
	// Port is the UDP port of the node's mesh device (0: no mesh).
	Port int `json:"port,omitempty"`
	// NetdSocket is the k3sm-netd that owns the device and the key.
	NetdSocket string `json:"netdSocket,omitempty"`
}

// MetricsAPI is how the node serves metrics.k8s.io to the aggregator.
type MetricsAPI struct {
	// Addr to listen on (host:port); empty disables the server.
	Addr string `json:"addr,omitempty"`
	// Serving certificate for <service>.<namespace>.svc, signed by the CA
	// the APIService's caBundle names.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// RequestHeaderCAFile and AllowedNames identify the apiserver's
	// front-proxy client certificate; only it may call.
	RequestHeaderCAFile string   `json:"requestHeaderCAFile,omitempty"`
	AllowedNames        []string `json:"allowedNames,omitempty"`
	// Resolution is how often usage is sampled (0: the default).
	Resolution time.Duration `json:"resolution,omitempty"`
	// ScrapeCertFile and ScrapeKeyFile are the client certificate the node
	// lists the cluster's Nodes and pods with and scrapes the other nodes'
	// kubelet /metrics/resource with, as metrics-server does;
	// KubeletCAFile verifies those kubelets' serving certificates. Empty:
	// only this node's metrics are served.
	ScrapeCertFile string `json:"scrapeCertFile,omitempty"`
	ScrapeKeyFile  string `json:"scrapeKeyFile,omitempty"`
	KubeletCAFile  string `json:"kubeletCAFile,omitempty"`
}

// Write stores cfg at path (0600: it names credentials) and returns the
// child's arguments after its role name.
func Write(path string, cfg any) ([]string, error) {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("role config: %w", err)
	}
	return []string{"--config=" + path}, nil
}

// Read parses a role's arguments (`--config=<file>`) into cfg.
func Read(role string, args []string, cfg any) error {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	path := fs.String("config", "", "the role's configuration, written by the k3sm server")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		return fmt.Errorf("%s is started by `k3sm server` as `k3sm %s --config=<file>`", role, role)
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("%s: config %s: %w (was it written by another k3sm version?)", role, *path, err)
	}
	if dec.More() {
		return fmt.Errorf("%s: config %s: %w", role, *path, errors.New("trailing data"))
	}
	return nil
}
