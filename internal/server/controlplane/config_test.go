package controlplane

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"k8s.io/klog/v2"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

func TestValidateNamesTheFlag(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"overlap", func(c *Config) { c.ServiceCIDR, c.ClusterCIDR = "10.0.0.0/16", "10.0.0.0/8" }, []string{"--service-cidr", "overlaps"}},
		{"host bits", func(c *Config) { c.ServiceCIDR = "10.43.0.1/16" }, []string{"--service-cidr", "10.43.0.0/16"}},
		{"too large", func(c *Config) { c.ServiceCIDR = "10.0.0.0/8"; c.ClusterDNS = "10.0.0.10" }, []string{"--service-cidr", "/12"}},
		{"dns outside", func(c *Config) { c.ClusterDNS = "10.44.0.10" }, []string{"--cluster-dns", "outside"}},
		{"dns is api ip", func(c *Config) { c.ClusterDNS = "10.43.0.1" }, []string{"--cluster-dns", "API Service"}},
		{"port", func(c *Config) { c.HTTPSPort = 70000 }, []string{"--https-listen-port", "1 to 65535"}},
		{"bind", func(c *Config) { c.BindAddress = "localhost" }, []string{"--bind-address"}},
		{"supervisor port is the API's", func(c *Config) { c.SupervisorPort = c.HTTPSPort }, []string{"--supervisor-port", "another port"}},
		{"supervisor port", func(c *Config) { c.SupervisorPort = -1 }, []string{"--supervisor-port", "0 for no join endpoint"}},
		{"mesh port", func(c *Config) { c.MeshPort = 70000 }, []string{"--mesh-port", "0 for no mesh"}},
		{"pod range too small", func(c *Config) { c.ClusterCIDR = "100.64.0.0/28" }, []string{"--cluster-cidr", "/24"}},
		{"pod range too small for max-pods", func(c *Config) { c.ClusterCIDR, c.MaxPods = "100.64.0.0/23", 510 }, []string{"--cluster-cidr", "/22", "--max-pods 510"}},
		{"max-pods beyond a /16", func(c *Config) { c.MaxPods = 70000 }, []string{"--max-pods", "65533"}},
		{"pod-max-pids zero", func(c *Config) { c.PodMaxPids = 0 }, []string{"--pod-max-pids", "-1 (no limit)", "4096"}},
		{"pod-max-pids below -1", func(c *Config) { c.PodMaxPids = -5 }, []string{"--pod-max-pids", "-5"}},
		{"san", func(c *Config) { c.TLSSANs = []string{"a b"} }, []string{"--tls-san"}},
		{"node name", func(c *Config) { c.NodeName = "Bad_Name" }, []string{"--node-name"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.DataDir = t.TempDir()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestValidateDefaults(t *testing.T) {
	c := Defaults()
	c.NodeName = "node-1"
	c.BindAddress = "127.0.0.1"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.AdvertiseAddress != "127.0.0.1" {
		t.Fatalf("advertise address = %q, want the specific bind address", c.AdvertiseAddress)
	}
	if ip, _ := APIServiceIP(c.ServiceCIDR); ip.String() != "10.43.0.1" {
		t.Fatalf("API service IP = %s", ip)
	}
}

func TestPKIReuseAndSANChange(t *testing.T) {
	c := Defaults()
	c.DataDir, c.NodeName, c.BindAddress = t.TempDir(), "n", "127.0.0.1"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	first, err := EnsurePKI(&c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsurePKI(&c)
	if err != nil {
		t.Fatal(err)
	}
	if !first.ServerCA.Cert.Equal(again.ServerCA.Cert) {
		t.Fatal("server CA regenerated on second start")
	}
	serving := readCert(t, first.Serving.CertPath)
	if err := serving.VerifyHostname("10.43.0.1"); err != nil {
		t.Fatalf("serving cert lacks the API Service IP: %v", err)
	}
	c.TLSSANs = []string{"k3sm.example.test", "192.0.2.7"}
	third, err := EnsurePKI(&c)
	if err != nil {
		t.Fatal(err)
	}
	serving = readCert(t, third.Serving.CertPath)
	for _, h := range []string{"k3sm.example.test", "192.0.2.7", "127.0.0.1", "localhost"} {
		if err := serving.VerifyHostname(h); err != nil {
			t.Fatalf("re-issued serving cert: %v", err)
		}
	}
	admin := readCert(t, third.Admin.CertPath)
	if admin.Subject.CommonName != AdminUser || admin.Subject.Organization[0] != "system:masters" {
		t.Fatalf("admin subject %v", admin.Subject)
	}
}

// Linux nodes run pods that name no OS, so they are untainted unless asked;
// other OSes keep such pods off with the provider taint.
func TestDefaultNodeTaint(t *testing.T) {
	if DefaultNodeTaint("linux") || !DefaultNodeTaint("darwin") {
		t.Fatalf("linux %v, darwin %v", DefaultNodeTaint("linux"), DefaultNodeTaint("darwin"))
	}
}

// The controller-manager's own default (20 requests/s, burst 30) throttled a
// fresh start by ~4 s: every controller gets its ServiceAccount and token
// before it starts (bench/RESULTS.md, issue 17).
func TestControllerManagerIsNotThrottled(t *testing.T) {
	p := testPlane(t)
	flags := map[string]string{}
	for _, a := range (controllerManager{p}).Args() {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	qps, err1 := strconv.Atoi(flags["kube-api-qps"])
	burst, err2 := strconv.Atoi(flags["kube-api-burst"])
	if err1 != nil || err2 != nil || qps < 100 || burst < qps {
		t.Fatalf("controller-manager client rate qps=%q burst=%q; want qps >= 100 and burst >= qps", flags["kube-api-qps"], flags["kube-api-burst"])
	}
	if flags["use-service-account-credentials"] != "true" {
		t.Fatal("the controllers no longer use their own credentials: the rate limit may not be needed any more")
	}
}

// The scheduler's configuration file is one the scheduler itself loads,
// with the client rate and the settings its flags used to carry.
func TestSchedulerConfigLoads(t *testing.T) {
	p := testPlane(t)
	args, err := p.SchedulerArgs()
	if err != nil {
		t.Fatal(err)
	}
	var path string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			path = v
		}
		if strings.HasPrefix(a, "--kubeconfig") || strings.HasPrefix(a, "--leader-elect") || strings.HasPrefix(a, "--profiling") {
			t.Errorf("%s: a flag the configuration file overrides", a)
		}
	}
	cfg, err := scheduleroptions.LoadConfigFromFile(klog.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	cc := cfg.ClientConnection
	if cc.QPS < 100 || cc.Burst < int32(cc.QPS) || cc.Kubeconfig != p.Layout.Cred("scheduler") {
		t.Fatalf("client connection %+v", cc)
	}
	if cfg.LeaderElection.LeaderElect || cfg.EnableProfiling {
		t.Fatalf("leader election %v, profiling %v: want both off", cfg.LeaderElection.LeaderElect, cfg.EnableProfiling)
	}

	// On an external datastore several servers may run the scheduler and
	// the controller-manager: one of each acts, by leader election.
	p.Cfg.Datastore.Endpoint = "postgres://k3sm@127.0.0.1:5432/k3sm"
	if _, err := p.SchedulerArgs(); err != nil {
		t.Fatal(err)
	}
	if cfg, err = scheduleroptions.LoadConfigFromFile(klog.Background(), path); err != nil {
		t.Fatal(err)
	}
	if !cfg.LeaderElection.LeaderElect {
		t.Errorf("scheduler on an external datastore: leader election off")
	}
	if !slices.Contains(controllerManager{p}.Args(), "--leader-elect=true") {
		t.Errorf("controller-manager on an external datastore: %v, want --leader-elect=true", controllerManager{p}.Args())
	}
}

// --token joins a cluster through its external datastore: without one, or
// malformed, it is refused naming the flag and never echoed.
func TestValidateToken(t *testing.T) {
	const secret = "0123456789abcdef"
	tok := "K10" + strings.Repeat("ab", 32) + "::abcdef." + secret
	for _, tc := range []struct {
		name, endpoint, token string
		want                  []string
	}{
		{"no datastore", "", tok, []string{"--token", "--datastore-endpoint"}},
		{"malformed", "postgres://k@127.0.0.1:5432/k", "abcdef." + secret, []string{"--token", "K10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.DataDir, c.Token, c.Datastore.Endpoint = t.TempDir(), tc.token, tc.endpoint
			err := c.Validate()
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error shows the token's secret: %v", err)
			}
		})
	}
	c := Defaults()
	c.DataDir, c.Token, c.Datastore.Endpoint = t.TempDir(), tok, "postgres://k@127.0.0.1:5432/k"
	if err := c.Validate(); err != nil {
		t.Errorf("a token with a datastore: %v", err)
	}
	if s := c.SharedSettings(); s["service-cidr"] != c.ServiceCIDR || s["cluster-cidr"] != c.ClusterCIDR || s["secrets-encryption"] != "false" {
		t.Errorf("shared settings %v", s)
	}
}

// testPlane is a Plane on a fresh data dir, its PKI made.
func testPlane(t *testing.T) *Plane {
	t.Helper()
	c := Defaults()
	c.DataDir, c.NodeName, c.BindAddress = t.TempDir(), "n", "127.0.0.1"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlane(&c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every pod the scheduler may place on a node gets an address: the node's
// pod range follows --max-pods (a /24 holds 253 pods besides its gateway).
func TestNodeCIDRFollowsMaxPods(t *testing.T) {
	for _, tc := range []struct{ maxPods, mask int }{{1, 24}, {110, 24}, {253, 24}, {254, 23}, {509, 23}, {510, 22}, {65533, 16}} {
		if got := NodeCIDRMaskSize(tc.maxPods); got != tc.mask {
			t.Errorf("NodeCIDRMaskSize(%d) = /%d, want /%d", tc.maxPods, got, tc.mask)
		}
	}
	p := testPlane(t)
	p.Cfg.MaxPods = 510
	var mask string
	for _, a := range (controllerManager{p}).Args() {
		if v, ok := strings.CutPrefix(a, "--node-cidr-mask-size-ipv4="); ok {
			mask = v
		}
	}
	if mask != "22" {
		t.Fatalf("controller-manager node-cidr-mask-size-ipv4=%q for --max-pods 510, want 22", mask)
	}
}

// The node's address is chosen by one rule that k3sm's own interfaces and
// ranges cannot change: a first start (only lo) and a start after a stop
// that left the pods' bridge (100.64.0.1 on k3sm0, pods still running)
// give the same answer.
func TestDefaultAdvertiseStable(t *testing.T) {
	list := func(as ...ifaceAddr) func() ([]ifaceAddr, error) {
		return func() ([]ifaceAddr, error) { return as, nil }
	}
	lo := ifaceAddr{"lo", netip.MustParseAddr("127.0.0.1")}
	bridge := ifaceAddr{"k3sm0", netip.MustParseAddr("100.64.0.1")}
	eth := ifaceAddr{"eth0", netip.MustParseAddr("192.0.2.10")}
	ranges := []string{"100.64.0.0/10", "10.43.0.0/16"}
	for _, c := range []struct {
		name string
		addr func() ([]ifaceAddr, error)
		want string
	}{
		{"only lo", list(lo), "127.0.0.1"},
		{"lo and the bridge left by a stop", list(lo, bridge), "127.0.0.1"},
		{"the bridge first", list(bridge, eth), "192.0.2.10"},
		{"a veth host end", list(lo, ifaceAddr{"k3v0123456789ab", netip.MustParseAddr("192.0.2.99")}, eth), "192.0.2.10"},
		{"an address in the Service range", list(ifaceAddr{"dummy0", netip.MustParseAddr("10.43.0.10")}, eth), "192.0.2.10"},
		{"link-local and IPv6", list(ifaceAddr{"eth1", netip.MustParseAddr("169.254.1.1")}, ifaceAddr{"eth1", netip.MustParseAddr("2001:db8::1")}, eth), "192.0.2.10"},
	} {
		if got := defaultAdvertise(netip.Addr{}, c.addr, ranges...); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if got := defaultAdvertise(netip.MustParseAddr("192.0.2.5"), list(eth), ranges...); got != "192.0.2.5" {
		t.Errorf("a specific bind address: %s", got)
	}
}

// A mesh port something else holds fails preflight, naming the flag,
// before anything starts (the netd this server starts would fail later).
func TestPreflightMeshPortTaken(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only a root server starts the netd that takes the port")
	}
	pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c := Defaults()
	c.DataDir = t.TempDir()
	c.BindAddress, c.NodeIP = "127.0.0.1", "127.0.0.1"
	for _, p := range []*int{&c.HTTPSPort, &c.SchedulerPort, &c.ControllerManagerPort, &c.KubeletPort, &c.SupervisorPort} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		*p = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	c.MeshPort = pc.LocalAddr().(*net.UDPAddr).Port
	release, err := Preflight(&c)
	if err == nil {
		release()
		t.Fatal("preflight passed with the mesh port taken")
	}
	if !strings.Contains(err.Error(), "--mesh-port") || !strings.Contains(err.Error(), strconv.Itoa(c.MeshPort)) {
		t.Fatalf("error %q does not name --mesh-port and the port", err)
	}
}

// Embedded etcd: --cluster-init, or --server with --token, and the flags
// that cannot go with them.
func TestEmbeddedEtcdFlags(t *testing.T) {
	tok := "K10" + strings.Repeat("ab", 32) + "::abcdef.0123456789abcdef"
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"init with datastore", func(c *Config) { c.ClusterInit, c.Datastore.Endpoint = true, "postgres://k@h:5432/k" }, []string{"--cluster-init", "--datastore-endpoint"}},
		{"init with token", func(c *Config) { c.ClusterInit, c.Token = true, tok }, []string{"--cluster-init", "--token"}},
		{"server without token", func(c *Config) { c.Server = "https://192.0.2.1:9345" }, []string{"--server", "--token"}},
		{"server with datastore", func(c *Config) {
			c.Server, c.Token, c.Datastore.Endpoint = "https://192.0.2.1:9345", tok, "postgres://k@h:5432/k"
		}, []string{"--server", "drop --server"}},
		{"server not https", func(c *Config) { c.Server, c.Token = "http://192.0.2.1:9345", tok }, []string{"--server", "https://HOST:PORT"}},
		{"etcd port", func(c *Config) { c.ClusterInit, c.EtcdPeerPort = true, 0 }, []string{"--etcd-peer-port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.DataDir = t.TempDir()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
	}{
		{"cluster-init", func(c *Config) { c.ClusterInit = true }},
		{"server and token", func(c *Config) { c.Server, c.Token = "https://192.0.2.1:9345/", tok }},
	} {
		c := Defaults()
		c.DataDir = t.TempDir()
		tc.mutate(&c)
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ds := c.Datastore; !ds.Embedded || ds.Endpoint != "https://127.0.0.1:2379" || !c.LeaderElect() || !strings.HasSuffix(ds.CAFile, "etcd-ca.crt") {
			t.Errorf("%s: datastore %+v, want the embedded member with leader election", tc.name, ds)
		}
	}
	// Scheduled snapshots work on the embedded member (etcd's own snapshot).
	sched := Defaults()
	sched.DataDir, sched.ClusterInit, sched.Ops.SnapshotSchedule = t.TempDir(), true, time.Hour
	if err := sched.Validate(); err != nil {
		t.Errorf("--snapshot-schedule with --cluster-init: %v", err)
	}
	// A data dir whose cluster lives in its member keeps it without the flag.
	c := Defaults()
	c.DataDir = t.TempDir()
	c.ClusterInit = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := datastore.Write(datadir.New(c.DataDir), c.Datastore); err != nil {
		t.Fatal(err)
	}
	again := Defaults()
	again.DataDir = c.DataDir
	if err := again.Validate(); err != nil || !again.Datastore.Embedded {
		t.Errorf("restart without --cluster-init: %v, datastore %+v", err, again.Datastore)
	}
}
