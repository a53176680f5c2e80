// Package controlplane owns the k3sm server's control plane: its
// configuration and validation, the PKI and kubeconfig layout under the data
// directory, the supervisor Components of the upstream processes
// (kube-apiserver with kine in its process; kube-scheduler and
// kube-controller-manager in one, kube-controllers), and the fail-closed
// bootstrap that verifies authorization before anything else runs.
package controlplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/serverboot"
	"github.com/spf13/pflag"
)

// Config is what `k3sm server` is asked to run.
type Config struct {
	DataDir   string
	HTTPSPort int
	// SupervisorPort serves the join (HTTPS, /v1-k3sm/) on the bind
	// address; 0: no node can join.
	SupervisorPort int
	// MeshPort is the UDP port of this node's WireGuard mesh device, which
	// carries pod traffic to and from the other nodes; 0: no mesh.
	MeshPort         int
	BindAddress      string
	AdvertiseAddress string
	ServiceCIDR      string
	ClusterCIDR      string
	ClusterDNS       string
	ClusterDomain    string
	TLSSANs          []string
	NodeName         string
	NodeIP           string
	KubeletPort      int
	MaxPods          int
	// PodMaxPids (--pod-max-pids, the kubelet's flag) caps each pod's
	// processes and threads (cgroup pids.max); -1: no limit.
	PodMaxPids int64
	// RegistryPort serves the node-local OCI registry on 127.0.0.1 (0: off).
	RegistryPort int
	// PodNetwork: "auto" (a network namespace and address per pod through
	// k3sm-netd when running as root on Linux, else the node's network),
	// "netns" (required) or "host" (pods share the node's network).
	PodNetwork string
	// NetdSocket is a k3sm-netd run apart, as root (k3sm install's
	// unit), that the server uses instead of starting one: with it a
	// server that is not root gives pods their own network, netd being
	// the only privileged process. Its allowed uid is this server's.
	NetdSocket string
	// ServiceProxy: "auto" (ClusterIPs in the kernel through k3sm-netd's
	// nftables when netd runs, else the userspace relay), "nftables"
	// (required) or "userspace" (the relay serves every Service).
	ServiceProxy string
	// DNSConfig is the --dns-config file: per-domain forwarding for the
	// cluster DNS (see docs/networking.md).
	DNSConfig string
	// NodeTaint (--node-taint) gives the node the provider taint, so only
	// pods that tolerate it run there. DefaultNodeTaint says when it is on.
	NodeTaint bool
	// CgroupFavorDynMods (--cgroup-favordynmods) lets the runtime set the
	// host's cgroup2 favordynmods option (package cgroups): a container's
	// start then skips an RCU grace period.
	CgroupFavorDynMods bool
	// RegistriesConfig is a registries.yaml (mirrors, plain-HTTP endpoints, auth) for image pulls.
	RegistriesConfig string
	// NodeInstant makes the node mark pods Running without starting them:
	// the floor of the pod-start benchmark, never for real use.
	NodeInstant bool
	// NodeInstantWrites (with NodeInstant) is the fair floor: the node
	// makes every API write of a real start, but starts nothing.
	NodeInstantWrites bool
	// Datastore is --datastore-endpoint and its TLS files: empty for the
	// embedded SQLite file, else an external PostgreSQL, MySQL or etcd.
	Datastore datastore.Config
	// Token (--token, $K3SM_TOKEN) joins this server to the cluster that
	// already lives in Datastore: its first start reads the cluster's
	// keys from the bootstrap record sealed for this token (package
	// serverboot). Empty: the server makes (or has) its own cluster.
	Token string
	// ClusterInit (--cluster-init) keeps a new cluster in an embedded etcd
	// member of this server instead of SQLite; Server (--server) with
	// Token adds this server as a member of such a cluster (etcd.go).
	ClusterInit bool
	Server      string
	// EtcdClientPort and EtcdPeerPort are the embedded member's ports.
	EtcdClientPort, EtcdPeerPort int
	// DisableAgent runs the control plane without a node of this machine
	// (k3s's --disable-agent): no pods, runtime, pod network or metrics here.
	DisableAgent bool
	// Disk: container log rotation, image GC, DiskPressure.
	Disk diskpolicy.Config
	// Ops: snapshots, secrets encryption, the audit log (docs/operations.md).
	Ops Ops

	// Ports of the scheduler's and controller-manager's health endpoints (loopback only).
	SchedulerPort         int
	ControllerManagerPort int

	// ExtraArgs are the --kube-apiserver-arg, --kube-scheduler-arg and
	// --kube-controller-manager-arg values, by role name (see withExtraArgs).
	ExtraArgs map[string][]string
	// ComponentFlags returns an upstream component's flags, by role name, to
	// check ExtraArgs against before anything starts; nil skips that check
	// (only internal/upstream links the components).
	ComponentFlags func(role string) *pflag.FlagSet

	// Executable is the binary that serves the hidden component roles (normally os.Executable()).
	Executable string
}

// DefaultDataDir is /var/lib/k3sm for root and ~/.local/share/k3sm otherwise.
func DefaultDataDir() string {
	if d := os.Getenv("K3SM_DATA_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/k3sm"
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "k3sm")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "k3sm-data"
	}
	return filepath.Join(home, ".local", "share", "k3sm")
}

// Defaults returns the configuration an unconfigured server runs with.
func Defaults() Config {
	host, _ := os.Hostname()
	return Config{
		DataDir:               DefaultDataDir(),
		HTTPSPort:             6443,
		SupervisorPort:        DefaultSupervisorPort,
		MeshPort:              DefaultMeshPort,
		BindAddress:           "0.0.0.0",
		ServiceCIDR:           "10.43.0.0/16",
		ClusterCIDR:           "100.64.0.0/10",
		ClusterDNS:            "10.43.0.10",
		ClusterDomain:         "cluster.local",
		NodeName:              strings.ToLower(host),
		KubeletPort:           10250,
		EtcdClientPort:        DefaultEtcdClientPort,
		EtcdPeerPort:          DefaultEtcdPeerPort,
		MaxPods:               110,
		PodMaxPids:            cgroups.DefaultPodPidsLimit,
		PodNetwork:            "auto",
		ServiceProxy:          "auto",
		NodeTaint:             DefaultNodeTaint(goruntime.GOOS),
		CgroupFavorDynMods:    true,
		SchedulerPort:         10259,
		ControllerManagerPort: 10257,
		Disk:                  diskpolicy.Default(),
		Ops:                   Ops{SnapshotRetention: 5},
	}
}

// DefaultSupervisorPort is the join endpoint's port: RKE2's supervisor
// port, as k3s serves its join on the API port, which here is the
// apiserver's own.
const DefaultSupervisorPort = 9345

// DefaultMeshPort is the mesh's UDP port: WireGuard's, as k3s's
// wireguard-native backend uses.
const DefaultMeshPort = 51820

// DefaultNodeTaint is whether a node of this OS carries the provider taint
// unless told otherwise. A pod that names no OS is a Linux pod, so a Linux
// node runs standard manifests unchanged; a node of any other OS (darwin)
// keeps such manifests off, as the admission policy does.
func DefaultNodeTaint(goos string) bool { return goos != "linux" }

// FieldError names the flag at fault and what to do about it: one type
// for every flag of the server, defined where the datastore's checks (a
// package this one imports) return it too.
type FieldError = datastore.FieldError

// NetdAvailable reports whether pods can get their own network here: a
// k3sm-netd the server starts (as root) or one run apart (NetdSocket).
func (c *Config) NetdAvailable(euid int) bool { return euid == 0 || c.NetdSocket != "" }

// Validate checks everything that can be checked without side effects and
// fills derived fields (the advertise address when unset).
func (c *Config) Validate() error {
	var errs []error
	add := func(flag, value, problem, fix string) {
		errs = append(errs, &FieldError{Flag: flag, Value: value, Problem: problem, Fix: fix})
	}
	if c.DataDir == "" {
		add("data-dir", "", "must not be empty", "pass a directory k3sm may own")
	} else if abs, err := filepath.Abs(c.DataDir); err == nil {
		c.DataDir = abs
	}
	for _, p := range []struct {
		flag string
		v    int
	}{{"https-listen-port", c.HTTPSPort}, {"scheduler-port", c.SchedulerPort}, {"controller-manager-port", c.ControllerManagerPort}, {"kubelet-port", c.KubeletPort}} {
		if p.v < 1 || p.v > 65535 {
			add(p.flag, fmt.Sprint(p.v), "not a TCP port", "use a number from 1 to 65535")
		}
	}
	if c.SupervisorPort < 0 || c.SupervisorPort > 65535 {
		add("supervisor-port", fmt.Sprint(c.SupervisorPort), "not a TCP port", "use a number from 1 to 65535, or 0 for no join endpoint")
	} else if c.SupervisorPort != 0 && slices.Contains([]int{c.HTTPSPort, c.SchedulerPort, c.ControllerManagerPort, c.KubeletPort, c.RegistryPort}, c.SupervisorPort) {
		add("supervisor-port", fmt.Sprint(c.SupervisorPort), "is already another port of this server", fmt.Sprintf("use another port, e.g. the default %d", DefaultSupervisorPort))
	}
	if c.MeshPort < 0 || c.MeshPort > 65535 {
		add("mesh-port", fmt.Sprint(c.MeshPort), "not a UDP port", fmt.Sprintf("use a number from 1 to 65535 (default %d), or 0 for no mesh", DefaultMeshPort))
	}
	bind, err := netip.ParseAddr(c.BindAddress)
	if err != nil {
		add("bind-address", c.BindAddress, "not an IP address", "use e.g. 0.0.0.0 or 127.0.0.1")
	}
	if c.AdvertiseAddress == "" {
		c.AdvertiseAddress = defaultAdvertise(bind, interfaceAddrs, c.ClusterCIDR, c.ServiceCIDR)
	} else if _, err := netip.ParseAddr(c.AdvertiseAddress); err != nil {
		add("advertise-address", c.AdvertiseAddress, "not an IP address", "use the address other machines reach this server on")
	}
	switch c.PodNetwork {
	case "", "auto", "netns", "host":
	default:
		add("pod-network", c.PodNetwork, "unknown mode", "use auto, netns or host")
	}
	if c.NetdSocket != "" && !filepath.IsAbs(c.NetdSocket) {
		add("netd-socket", c.NetdSocket, "not an absolute path", "give the socket k3sm-netd serves, e.g. /run/k3sm/netd.sock")
	}
	if c.NetdSocket != "" && c.PodNetwork == "host" {
		add("netd-socket", c.NetdSocket, "given with --pod-network=host", "drop one of them")
	}
	switch c.ServiceProxy {
	case "", "auto", "nftables", "userspace":
	default:
		add("service-proxy", c.ServiceProxy, "unknown mode", "use auto, nftables or userspace")
	}
	if c.RegistryPort < 0 || c.RegistryPort > 65535 {
		add("registry-port", fmt.Sprint(c.RegistryPort), "must be a TCP port", "use e.g. 5000, or 0 for no registry")
	}
	if c.PodMaxPids < -1 || c.PodMaxPids == 0 {
		add("pod-max-pids", fmt.Sprint(c.PodMaxPids), "must be -1 (no limit) or at least 1", fmt.Sprintf("use e.g. %d, the default", cgroups.DefaultPodPidsLimit))
	}
	if c.MaxPods < 1 {
		add("max-pods", fmt.Sprint(c.MaxPods), "must be at least 1", "use e.g. 110")
	}
	if c.NodeIP == "" {
		c.NodeIP = c.AdvertiseAddress
	} else if _, err := netip.ParseAddr(c.NodeIP); err != nil {
		add("node-ip", c.NodeIP, "not an IP address", "use an address of this machine")
	}
	if c.RegistriesConfig == "" && c.DataDir != "" {
		c.RegistriesConfig = datadir.New(c.DataDir).RegistriesFile()
	}
	svc, svcErr := netip.ParsePrefix(c.ServiceCIDR)
	if svcErr != nil {
		add("service-cidr", c.ServiceCIDR, "not a CIDR", "use e.g. 10.43.0.0/16")
	} else if svc.Masked() != svc {
		add("service-cidr", c.ServiceCIDR, "has host bits set", "use "+svc.Masked().String())
	} else if svc.Addr().Is4() && svc.Bits() < 12 {
		add("service-cidr", c.ServiceCIDR, "is larger than the apiserver allows (/12)", "use a /12 or smaller range")
	}
	pods, podErr := netip.ParsePrefix(c.ClusterCIDR)
	if podErr != nil {
		add("cluster-cidr", c.ClusterCIDR, "not a CIDR", "use e.g. 100.64.0.0/10")
	} else if pods.Masked() != pods {
		add("cluster-cidr", c.ClusterCIDR, "has host bits set", "use "+pods.Masked().String())
	} else if pods.Addr().Is4() && pods.Bits() > NodeCIDRMaskSize(c.MaxPods) {
		add("cluster-cidr", c.ClusterCIDR, fmt.Sprintf("is smaller than one node's /%d (for --max-pods %d)", NodeCIDRMaskSize(c.MaxPods), c.MaxPods),
			fmt.Sprintf("use a /%d or larger range", NodeCIDRMaskSize(c.MaxPods)))
	}
	if c.MaxPods > maxPodsPerNode {
		add("max-pods", fmt.Sprint(c.MaxPods), fmt.Sprintf("is more than a node's /16 pod range holds (%d)", maxPodsPerNode), fmt.Sprintf("use at most %d", maxPodsPerNode))
	}
	if svcErr == nil && podErr == nil && svc.Overlaps(pods) {
		add("service-cidr", c.ServiceCIDR, "overlaps --cluster-cidr "+c.ClusterCIDR, "choose ranges that do not overlap")
	}
	if dns, err := netip.ParseAddr(c.ClusterDNS); err != nil {
		add("cluster-dns", c.ClusterDNS, "not an IP address", "use an address inside --service-cidr, e.g. 10.43.0.10")
	} else if svcErr == nil {
		if !svc.Contains(dns) {
			add("cluster-dns", c.ClusterDNS, "is outside --service-cidr "+c.ServiceCIDR, "use an address inside it")
		} else if api, _ := APIServiceIP(c.ServiceCIDR); dns == api {
			add("cluster-dns", c.ClusterDNS, "is the kubernetes API Service address", "use another address in --service-cidr")
		}
	}
	for _, san := range c.TLSSANs {
		if san == "" || strings.ContainsAny(san, " /,") {
			add("tls-san", san, "not a host name or IP address", "pass one name or address per --tls-san")
		}
	}
	if c.NodeName == "" || len(c.NodeName) > 253 || strings.Trim(strings.ToLower(c.NodeName), "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" {
		add("node-name", c.NodeName, "not a valid Kubernetes node name", "use lower-case letters, digits, '-' and '.'")
	}
	c.resolveEmbedded(add)
	for _, e := range c.Datastore.Validate() {
		add(e.Flag, e.Value, e.Problem, e.Fix)
	}
	if c.Token != "" {
		if !c.Datastore.External() {
			add(serverboot.FlagToken, "(given)", "a server joins a cluster through the cluster's database or through a server of a cluster with embedded etcd, and neither is given",
				"give the cluster's --datastore-endpoint, or --server https://HOST:9345 of a server made with --cluster-init; or drop --token for a cluster of its own")
		} else if _, err := joinv1.ParseToken(c.Token); err != nil {
			add(serverboot.FlagToken, "(given)", strings.TrimPrefix(err.Error(), "--token: "), "")
		}
	}
	if c.Datastore.External() && !c.Datastore.Embedded && c.Ops.SnapshotSchedule > 0 {
		add("snapshot-schedule", c.Ops.SnapshotSchedule.String(), "k3sm snapshots copy the embedded SQLite datastore, and this cluster lives in --datastore-endpoint",
			"leave it at 0 and back the database up with "+c.Datastore.Kind().BackupTool())
	}
	c.validateExtraArgs(add)
	c.validateProcessFlags(add)
	c.Disk.Validate(add)
	c.Ops.validate(c.DataDir, add)
	return errors.Join(errs...)
}

// defaultAdvertise picks the address the apiserver advertises (and the
// node's INTERNAL-IP, unless --node-ip says otherwise): the bind address
// when it is specific; else the first IPv4 address, in the order the
// system lists its interfaces, that is not loopback or link-local and is
// not k3sm's own (on its bridge or a pod's veth, or inside the cluster or
// Service range: what k3sm adds to the machine, and leaves while pods run
// after a stop, must not change the answer of the next start); else
// loopback (single-machine use).
func defaultAdvertise(bind netip.Addr, addrs func() ([]ifaceAddr, error), ranges ...string) string {
	if bind.IsValid() && !bind.IsUnspecified() {
		return bind.String()
	}
	var own []netip.Prefix
	for _, r := range ranges {
		if p, err := netip.ParsePrefix(r); err == nil {
			own = append(own, p.Masked())
		}
	}
	list, err := addrs()
	if err != nil {
		return "127.0.0.1"
	}
	for _, a := range list {
		ip := a.IP.Unmap()
		if !ip.Is4() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ownInterface(a.Interface) ||
			slices.ContainsFunc(own, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		return ip.String()
	}
	return "127.0.0.1"
}

// ownInterface reports whether a network interface is k3sm-netd's: the
// pods' bridge or the host end of a pod's veth (the names netd's server
// and dataplane give them, which this side does not link).
func ownInterface(name string) bool { return name == "k3sm0" || strings.HasPrefix(name, "k3v") }

// ifaceAddr is one address of one interface.
type ifaceAddr struct {
	Interface string
	IP        netip.Addr
}

// interfaceAddrs lists the machine's addresses, interface by interface in
// the system's order (by index on Linux).
func interfaceAddrs() ([]ifaceAddr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []ifaceAddr
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					out = append(out, ifaceAddr{Interface: i.Name, IP: ip})
				}
			}
		}
	}
	return out, nil
}

// APIServiceIP is the first address of the service range: the `kubernetes` Service.
func APIServiceIP(serviceCIDR string) (netip.Addr, error) {
	p, err := netip.ParsePrefix(serviceCIDR)
	if err != nil {
		return netip.Addr{}, err
	}
	return p.Masked().Addr().Next(), nil
}

// LocalAPIHost is the address local clients (kubeconfigs, health checks) use.
func (c *Config) LocalAPIHost() string {
	if a, err := netip.ParseAddr(c.BindAddress); err == nil && !a.IsUnspecified() {
		return a.String()
	}
	return "127.0.0.1"
}

// LocalAPIURL is the apiserver URL for clients on this machine.
func (c *Config) LocalAPIURL() string {
	return "https://" + net.JoinHostPort(c.LocalAPIHost(), fmt.Sprint(c.HTTPSPort))
}

// Ops are the operations flags of `k3sm server` (docs/operations.md).
type Ops struct {
	// SecretsEncryption (--secrets-encryption) encrypts Secrets at rest; it
	// takes effect on the start that creates the cluster only.
	SecretsEncryption bool
	// AuditLog (--audit-log[=PATH]) is the audit log's path; "" is off,
	// AuditLogDefault is <data-dir>/logs/audit.log.
	AuditLog string
	// SnapshotSchedule (--snapshot-schedule) is how often the server saves a
	// snapshot; 0 never. SnapshotRetention scheduled ones are kept.
	SnapshotSchedule  time.Duration
	SnapshotRetention int
	// SnapshotDir (--snapshot-dir) is where snapshots go (default <data-dir>/server/snapshots).
	SnapshotDir string

	// Set at start by the ops addon, passed to the apiserver when not empty.
	EncryptionProviderConfig string
	AuditPolicyFile          string
}

// AuditLogDefault is what a bare --audit-log means.
const AuditLogDefault = "default"

func (o *Ops) validate(dataDir string, add func(flag, value, problem, fix string)) {
	l := datadir.New(dataDir)
	switch {
	case o.AuditLog == AuditLogDefault:
		o.AuditLog = l.AuditLog()
	case o.AuditLog != "":
		if abs, err := filepath.Abs(o.AuditLog); err == nil {
			o.AuditLog = abs
		}
	}
	if o.SnapshotSchedule < 0 || (o.SnapshotSchedule > 0 && o.SnapshotSchedule < time.Second) {
		add("snapshot-schedule", o.SnapshotSchedule.String(), "must be 0 (off) or at least 1s", "use a Go duration such as 12h or 30m")
	}
	if o.SnapshotRetention < 1 {
		add("snapshot-retention", fmt.Sprint(o.SnapshotRetention), "must be at least 1", "keep e.g. 5 scheduled snapshots")
	}
	if o.SnapshotDir == "" {
		o.SnapshotDir = l.SnapshotsDir()
	} else if abs, err := filepath.Abs(o.SnapshotDir); err == nil {
		o.SnapshotDir = abs
	}
}

// LockDataDir takes the data directory's server lock (k3sm.lock) for a
// command that must not run beside a server (snapshot restore, certificate
// rotate). The error says which server holds it.
func LockDataDir(dataDir string) (release func(), err error) {
	return datadir.Lock(datadir.New(dataDir).LockFile(), "server")
}

// ServerHoldsLock reports whether a server runs on the data dir (holds
// k3sm.lock) and its pid, without creating anything there.
func ServerHoldsLock(dataDir string) (running bool, pid int, err error) {
	return datadir.LockHeld(datadir.New(dataDir).LockFile())
}

// maxPodsPerNode is what a node's largest pod range, a /16, holds: all but
// its network, broadcast and gateway addresses.
const maxPodsPerNode = 1<<16 - 3

// NodeCIDRMaskSize is the size of each node's pod range: a /24 (the
// kubelet's default, 253 pods) or, for a --max-pods that does not fit one,
// the smallest range that holds that many pods, so every pod the scheduler
// places gets an address.
func NodeCIDRMaskSize(maxPods int) int {
	m := 24
	for m > 16 && 1<<(32-m)-3 < maxPods {
		m--
	}
	return m
}
