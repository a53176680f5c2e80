// Package status answers `k3sm status`: whether a cluster is installed at a
// data dir, whether its server runs, and the health of each component,
// probed where the server's own readiness checks probe them (health
// endpoints on loopback, unix sockets, the Node's Ready condition), with
// the pids and restart counts the supervisor records in
// <data-dir>/run/components.json.
package status

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/limits"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/k3sm-dev/k3sm/internal/syserr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// States and their exit codes (k3sm-anchor: 0 running, 3 stopped,
// 4 degraded, 5 not installed).
const (
	Running      = "running"
	Stopped      = "stopped"
	Degraded     = "degraded"
	NotInstalled = "not-installed"
)

// ExitCode is the exit code of `k3sm status` for a state.
func ExitCode(state string) int {
	switch state {
	case Running:
		return 0
	case Stopped:
		return 3
	case Degraded:
		return 4
	case NotInstalled:
		return 5
	}
	return 1
}

// Component health.
const (
	OK        = "ok"        // running and its health check passes
	Unhealthy = "unhealthy" // running but its health check fails
	Down      = "down"      // no process (exited; the supervisor restarts it)
	Off       = "off"       // not run by this server's configuration
	// Impaired: running and answering, but it cannot do all of its job:
	// runtimed on Linux whose cgroups do not hold pods to their CPU or
	// memory limits (the state is degraded).
	Impaired = "impaired"
)

// impaired is a probe's answer for a component that serves, but not all
// it should.
type impaired struct{ detail string }

func (i impaired) Error() string { return i.detail }

// Report is the -o json schema of `k3sm status` (docs/operations.md).
type Report struct {
	DataDir  string `json:"dataDir"`
	State    string `json:"state"`
	ExitCode int    `json:"exitCode"`
	// Cluster: a cluster exists at DataDir (its server CA does).
	Cluster bool `json:"cluster"`
	// ServiceUnits are the k3sm service files installed on this machine.
	ServiceUnits []string    `json:"serviceUnits"`
	Server       *ServerInfo `json:"server,omitempty"`
	Components   []Component `json:"components"`
	// Hint says what to do next; empty when running.
	Hint string `json:"hint,omitempty"`
}

// ServerInfo is the running server.
type ServerInfo struct {
	Pid     int       `json:"pid"`
	Started time.Time `json:"started"`
	Version string    `json:"version"`
	APIURL  string    `json:"apiURL"`
	Node    string    `json:"node"`
}

// Component is one line of the report.
type Component struct {
	Name     string `json:"name"`
	Health   string `json:"health"`
	Pid      int    `json:"pid,omitempty"`
	Restarts int    `json:"restarts"`
	Detail   string `json:"detail"`
}

// Options tune Check; zero values are fine.
type Options struct {
	// Timeout bounds each probe (default 2 s).
	Timeout time.Duration
	// Units overrides ServiceUnitPaths (tests).
	Units []string
}

// Check inspects the data dir.
func Check(ctx context.Context, dataDir string, o Options) (*Report, error) {
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Units == nil {
		o.Units = ServiceUnitPaths()
	}
	l := datadir.New(dataDir)
	r := &Report{DataDir: dataDir, ServiceUnits: []string{}, Components: []Component{}}
	for _, u := range o.Units {
		if _, err := os.Stat(u); err == nil {
			r.ServiceUnits = append(r.ServiceUnits, u)
		}
	}
	_, err := os.Stat(l.TLS("server-ca.crt"))
	r.Cluster = err == nil
	running, pid, err := controlplane.ServerHoldsLock(dataDir)
	if err != nil {
		return nil, fmt.Errorf("cannot tell whether a server runs on %s: %w (run as the user that owns the data dir, e.g. with sudo)", dataDir, err)
	}
	switch {
	case !running && !r.Cluster && len(r.ServiceUnits) == 0:
		r.State = NotInstalled
		r.Hint = fmt.Sprintf("no cluster at %s and no k3sm service installed: run `k3sm install`, or `k3sm server --data-dir %s`; another data dir: --data-dir or $K3SM_DATA_DIR", dataDir, dataDir)
	case !running:
		r.State = Stopped
		r.Components = append(r.Components, Component{Name: "server", Health: Down, Detail: "no server holds " + l.LockFile()})
		r.Hint = fmt.Sprintf("start it: %s", startHint(r.ServiceUnits, dataDir))
	default:
		r.checkRunning(ctx, l, pid, o.Timeout)
	}
	r.ExitCode = ExitCode(r.State)
	return r, nil
}

func startHint(units []string, dataDir string) string {
	if len(units) > 0 {
		return StartCommand()
	}
	return "k3sm server --data-dir " + dataDir
}

// noAgent is the detail of the node's parts on a server without a node.
const noAgent = "this server runs no node of its own (--disable-agent)"

func (r *Report) checkRunning(ctx context.Context, l datadir.Layout, pid int, timeout time.Duration) {
	r.State = Running
	server := Component{Name: "server", Health: OK, Pid: pid, Detail: "holds " + l.LockFile()}
	ri, riErr := controlplane.ReadRunInfo(l.Root)
	st, stErr := supervisor.ReadState(l.ComponentsFile())
	switch {
	case riErr != nil || stErr != nil:
		// An older server, or one still writing them at start.
		server.Health, server.Detail = Unhealthy, fmt.Sprintf("the server's state files are missing (%v): it may be starting; a server older than this k3sm does not write them", errors.Join(riErr, stErr))
	default:
		server.Detail = "API " + ri.APIURL + ", up since " + ri.Started.Local().Format(time.DateTime)
		r.Server = &ServerInfo{Pid: pid, Started: ri.Started, Version: ri.Version, APIURL: ri.APIURL, Node: ri.NodeName}
	}
	r.Components = append(r.Components, server)
	children := map[string]supervisor.ChildState{}
	for _, c := range st.Children {
		children[c.Name] = c
	}
	p := prober{l: l, ri: ri, timeout: timeout}
	// Which datastore the cluster lives in (written once the apiserver
	// first served from it).
	rec, recorded, _ := datastore.Recorded(l)
	kineDetail := "datastore " + l.DBFile()
	if recorded && rec.Kind() != datastore.SQLite {
		kineDetail = "datastore " + rec.Endpoint()
	}
	probes := []struct {
		name  string
		probe func(context.Context) (string, error)
	}{
		{roleconfig.Kine, p.unix(l.KineSocket(), kineDetail)},
		{roleconfig.APIServer, p.apiserver},
		{roleconfig.Scheduler, p.healthz(ri.SchedulerPort)},
		{roleconfig.ControllerManager, p.healthz(ri.ControllerManagerPort)},
		{roleconfig.Runtime, p.runtime(l.RuntimeSocket())},
		{roleconfig.Netd, p.unix(netdSocket(l, ri), "")},
		{roleconfig.Node, p.node},
	}
	if recorded && rec.Config.Embedded {
		// The embedded etcd member, a child of its own, ready when it answers.
		probes = append(probes[:1:1], append([]struct {
			name  string
			probe func(context.Context) (string, error)
		}{{roleconfig.Etcd, func(ctx context.Context) (string, error) {
			if err := rec.Answer(ctx, l); err != nil {
				return "", err
			}
			return "member answers at " + rec.Config.Endpoint, nil
		}}}, probes[1:]...)...)
	}
	for _, pr := range probes {
		c := Component{Name: pr.name}
		// The child (and its log) the component runs in: the scheduler and
		// controller-manager share one (roleconfig.Controllers), and kine
		// runs in the apiserver's (roleconfig.KineFlag).
		child := pr.name
		if _, shared := children[roleconfig.Controllers]; shared && (pr.name == roleconfig.Scheduler || pr.name == roleconfig.ControllerManager) {
			child = roleconfig.Controllers
		}
		if _, own := children[roleconfig.Kine]; !own && pr.name == roleconfig.Kine {
			child = roleconfig.APIServer
		}
		ch, ok := children[child]
		switch {
		case ri.DisableAgent && (pr.name == roleconfig.Runtime || pr.name == roleconfig.Netd || pr.name == roleconfig.Node):
			c.Health, c.Detail = Off, noAgent
		case pr.name == roleconfig.Kine && recorded && rec.Kind() == datastore.Etcd:
			c.Health, c.Detail = Off, "the apiserver speaks to etcd at "+rec.Endpoint()+" directly"
		case pr.name == roleconfig.Netd && ri.NetdSocket != "":
			// Run apart (as root): not the server's child.
			pctx, cancel := context.WithTimeout(ctx, timeout)
			detail, err := pr.probe(pctx)
			cancel()
			if err != nil {
				c.Health, c.Detail = Unhealthy, err.Error()+": it runs apart from the server (--netd-socket); see its service's log"
			} else {
				c.Health, c.Detail = OK, join(detail, "run apart from the server (--netd-socket)")
			}
		case !ok && pr.name == roleconfig.Netd:
			c.Health, c.Detail = Off, "pods share the node's network (no k3sm-netd: not root, or --pod-network host)"
		case !ok && stErr == nil:
			c.Health, c.Detail = Down, "not started by the server (yet): see "+l.ServerLog()
		case ok && (ch.Pid == 0 || !alive(ch.Pid)):
			c.Health, c.Restarts = Down, ch.Restarts
			c.Detail = "exited (" + orUnknown(ch.LastExit) + "); the server restarts it: see " + l.LogDir() + "/" + child + ".log"
		default:
			c.Pid, c.Restarts = ch.Pid, ch.Restarts
			pctx, cancel := context.WithTimeout(ctx, timeout)
			detail, err := pr.probe(pctx)
			cancel()
			var imp impaired
			if errors.As(err, &imp) {
				c.Health, c.Detail = Impaired, imp.detail
			} else if err != nil {
				c.Health, c.Detail = Unhealthy, err.Error()+": see "+l.LogDir()+"/"+child+".log"
			} else {
				c.Health, c.Detail = OK, detail
				if child != pr.name {
					c.Detail = join(c.Detail, "in process "+child+", log "+l.LogDir()+"/"+child+".log")
				}
				if ch.Restarts > 0 && ch.LastExit != "" {
					c.Detail = join(c.Detail, "restarted "+strconv.Itoa(ch.Restarts)+"x, last "+ch.LastExit)
				}
			}
		}
		r.Components = append(r.Components, c)
	}
	if recorded {
		r.Components = append(r.Components, datastoreComponent(ctx, l, rec, timeout))
	}
	// The Service proxy and the cluster DNS run inside the node process,
	// and only with a pod network (netd).
	_, netd := children[roleconfig.Netd]
	netd = netd || ri.NetdSocket != ""
	for _, svc := range []struct {
		name  string
		probe func(context.Context) (string, error)
	}{{"service-proxy", p.proxy}, {"dns", p.dns}} {
		c := Component{Name: svc.name}
		if ri.DisableAgent {
			c.Health, c.Detail = Off, noAgent
		} else if !netd {
			c.Health, c.Detail = Off, "served only with a pod network (k3sm-netd)"
		} else if n, ok := children[roleconfig.Node]; !ok || n.Pid == 0 {
			c.Health, c.Detail = Down, "runs in the node process, which is down"
		} else {
			c.Pid = n.Pid
			pctx, cancel := context.WithTimeout(ctx, timeout)
			detail, err := svc.probe(pctx)
			cancel()
			if err != nil {
				c.Health, c.Detail = Unhealthy, err.Error()+": see "+l.LogDir()+"/node.log"
			} else {
				c.Health, c.Detail = OK, detail
			}
		}
		r.Components = append(r.Components, c)
	}
	r.Components = append(r.Components, p.meshComponent(ctx, netd, children))
	var bad, weak []string
	for _, c := range r.Components {
		switch c.Health {
		case Unhealthy, Down:
			bad = append(bad, c.Name)
		case Impaired:
			weak = append(weak, c.Name)
		}
	}
	var hints []string
	if len(bad) > 0 {
		hints = append(hints, fmt.Sprintf("unhealthy: %v; the supervisor restarts components that exit; see their logs in %s and %s", bad, l.LogDir(), l.ServerLog()))
	}
	if len(weak) > 0 {
		hints = append(hints, fmt.Sprintf("impaired: %v; `k3sm doctor` says how to fix it", weak))
	}
	if len(hints) > 0 {
		r.State = Degraded
		r.Hint = strings.Join(hints, "; ")
	}
}

// datastoreComponent says whether the database holding the cluster
// answers: an external one that does not leaves the apiserver unable to
// read or write anything, whatever its own health says.
func datastoreComponent(ctx context.Context, l datadir.Layout, rec datastore.Record, timeout time.Duration) Component {
	c := Component{Name: "datastore"}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := rec.Answer(pctx, l)
	cancel()
	what := rec.Endpoint()
	if rec.Kind() == datastore.SQLite {
		what = "embedded SQLite " + l.DBFile()
	}
	if err != nil {
		c.Health, c.Detail = Unhealthy, what+" does not answer: "+err.Error()+"; the apiserver can neither read nor write the cluster until it does"
	} else if rec.Kind() == datastore.SQLite {
		c.Health, c.Detail = OK, what
	} else {
		c.Health, c.Detail = OK, what+" answers"
	}
	return c
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// alive: signal 0 reaches pid (EPERM: it exists, owned by another user).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

type prober struct {
	l       datadir.Layout
	ri      controlplane.RunInfo
	timeout time.Duration
}

func (p prober) unix(path, detail string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			return "", fmt.Errorf("socket %s: %w", path, syserr.Cause(err))
		}
		c.Close()
		return join(detail, "serves "+path), nil
	}
}

// runtime asks runtimed what it reported at its start: which pod limits
// the kernel enforces (the same answer `k3sm doctor` shows).
func (p prober) runtime(socket string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		s, goos, err := limits.FromRuntime(ctx, socket)
		switch {
		case err != nil && goos != "":
			// Answers, but too old to say: what it answers is its health.
			return join("serves "+socket, err.Error()), nil
		case err != nil:
			return "", err
		case limits.Impaired(goos, s):
			d := fmt.Sprintf("serves %s, but pods' %s are not enforced by the kernel: %s", socket, limits.Unenforced(s), s.Describe())
			if s.Fix != "" {
				d += "; fix: " + s.Fix
			}
			return "", impaired{d}
		}
		return "serves " + socket + "; " + s.Describe(), nil
	}
}

func (p prober) client() (kubernetes.Interface, error) {
	rc, err := p.restConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// restConfig is the admin kubeconfig's, each call bounded by the probe's timeout.
func (p prober) restConfig() (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", p.l.AdminKubeconfig())
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	rc.Timeout = p.timeout
	return rc, nil
}

func (p prober) apiserver(ctx context.Context) (string, error) {
	kc, err := p.client()
	if err != nil {
		return "", err
	}
	body, err := kc.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("/readyz: %v %s", err, body)
	}
	return "/readyz ok at " + p.ri.APIURL, nil
}

// healthz GETs a loopback /healthz verified against the server CA, as the
// supervisor's readiness probe does.
func (p prober) healthz(port int) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		pem, err := os.ReadFile(p.l.TLS("server-ca.crt"))
		if err != nil {
			return "", err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return "", fmt.Errorf("%s: no answer within %s", url, p.timeout)
			}
			return "", fmt.Errorf("%s: %w", url, syserr.Cause(err))
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", url, resp.Status)
		}
		return url + " ok", nil
	}
}

func (p prober) node(ctx context.Context) (string, error) {
	kc, err := p.client()
	if err != nil {
		return "", err
	}
	n, err := kc.CoreV1().Nodes().Get(ctx, p.ri.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("node %s: %w", p.ri.NodeName, err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return "node " + n.Name + " Ready", nil
			}
			return "", fmt.Errorf("node %s Ready=%s: %s %s", n.Name, c.Status, c.Reason, c.Message)
		}
	}
	return "", fmt.Errorf("node %s has no Ready condition yet", n.Name)
}

// proxy connects to the kubernetes Service's ClusterIP, a socket the
// node's Service proxy owns.
func (p prober) proxy(ctx context.Context) (string, error) {
	ip, err := controlplane.APIServiceIP(p.ri.ServiceCIDR)
	if err != nil {
		return "", err
	}
	addr := net.JoinHostPort(ip.String(), "443")
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("Service kubernetes at %s: %w", addr, syserr.Cause(err))
	}
	c.Close()
	mode := ""
	switch p.ri.ServiceProxy {
	case "nftables":
		mode = " (ClusterIPs: nftables DNAT, table ip k3sm-services)"
	case "userspace":
		mode = " (ClusterIPs: userspace relay)"
	}
	return "Service kubernetes at " + addr + " answers" + mode, nil
}

// dns resolves the kubernetes Service's name at the cluster DNS address.
func (p prober) dns(ctx context.Context) (string, error) {
	server := net.JoinHostPort(p.ri.ClusterDNS, "53")
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, server)
	}}
	name := "kubernetes.default.svc." + p.ri.ClusterDomain + "."
	addrs, err := res.LookupHost(ctx, name)
	if err != nil {
		return "", fmt.Errorf("%s at %s: %w", name, server, err)
	}
	return fmt.Sprintf("%s -> %v at %s", name, addrs, server), nil
}

// meshComponent reports the node's place in the WireGuard mesh from the
// MeshPeers: its own exists, and its device has had a recent handshake
// with every other node's (the node's mesh controller writes that into its
// MeshPeer's status). A peer without one is Impaired, named.
func (p prober) meshComponent(ctx context.Context, netd bool, children map[string]supervisor.ChildState) Component {
	c := Component{Name: "mesh"}
	if p.ri.DisableAgent {
		c.Health, c.Detail = Off, noAgent
		return c
	}
	if !netd || p.ri.MeshPort == 0 {
		c.Health, c.Detail = Off, "no WireGuard mesh (--mesh-port 0, or no pod network): pods here reach no other node's pods"
		return c
	}
	if n, ok := children[roleconfig.Node]; !ok || n.Pid == 0 {
		c.Health, c.Detail = Down, "runs in the node process, which is down"
		return c
	}
	c.Pid = children[roleconfig.Node].Pid
	pctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	rc, err := p.restConfig()
	if err == nil {
		var dyn dynamic.Interface
		if dyn, err = dynamic.NewForConfig(rc); err == nil {
			var list *unstructured.UnstructuredList
			if list, err = dyn.Resource(netv1.MeshPeerGVR).List(pctx, metav1.ListOptions{}); err == nil {
				c.Health, c.Detail, err = meshHealth(list, p.ri.NodeName, p.ri.MeshPort)
			}
		}
	}
	if err != nil {
		c.Health, c.Detail = Unhealthy, err.Error()+": see "+p.l.LogDir()+"/node.log"
	}
	return c
}

// meshHealth judges the mesh from the MeshPeers, as node names this one.
func meshHealth(list *unstructured.UnstructuredList, node string, port int) (string, string, error) {
	var own *netv1.MeshPeer
	others := 0
	for i := range list.Items {
		mp, err := netv1.FromUnstructured(&list.Items[i])
		if err != nil {
			continue
		}
		if mp.Name == node {
			own = mp
		} else {
			others++
		}
	}
	if own == nil {
		return "", "", fmt.Errorf("node %s has no MeshPeer yet (its mesh device is not up)", node)
	}
	var late []string
	for _, ps := range own.Status.Peers {
		if !ps.Reachable {
			when := "never"
			if ps.LastHandshakeTime != nil {
				when = "last " + ps.LastHandshakeTime.Local().Format(time.DateTime)
			}
			late = append(late, ps.NodeName+" ("+when+")")
		}
	}
	switch {
	case len(late) > 0:
		return Impaired, fmt.Sprintf("no recent WireGuard handshake with %s: pods there are unreachable from here; is UDP %d open between the nodes, and is each node's endpoint (kubectl get meshpeers) an address the others reach?", strings.Join(late, ", "), port), nil
	case others == 0:
		return OK, fmt.Sprintf("device up (UDP %d, key %s); no other node yet", port, own.Spec.PublicKey), nil
	case len(own.Status.Peers) < others:
		return Impaired, fmt.Sprintf("%d other nodes have a MeshPeer but the device has %d peers (see node.log for the ones skipped)", others, len(own.Status.Peers)), nil
	}
	return OK, fmt.Sprintf("%d peers, each with a recent handshake (UDP %d)", others, port), nil
}

// netdSocket is where the server's k3sm-netd serves: its own child's, or
// the one run apart (--netd-socket).
func netdSocket(l datadir.Layout, ri controlplane.RunInfo) string {
	if ri.NetdSocket != "" {
		return ri.NetdSocket
	}
	return l.NetdSocket()
}
