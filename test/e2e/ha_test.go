package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/k3sm-dev/k3sm/internal/agent/apilb"
	"github.com/k3sm-dev/k3sm/internal/testutil/dbtest"
)

// nsK3sm runs a k3sm command in network namespace ns (where a server's
// loopback API is) and returns its combined output.
func nsK3sm(t *testing.T, ns string, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(c, "ip", append([]string{"netns", "exec", ns, k3smBin}, args...)...).CombinedOutput()
	return string(out), err
}

// TestHAServers: three servers, each in a network namespace of its own,
// on one PostgreSQL; the second and third join with a token and no file
// copied. An agent reaches the API through its load balancer. kill -9 of
// the first server loses no acknowledged write (1,000 ConfigMaps written
// through a balancer during the kill), leaves the agent Ready with its pod,
// moves the controllers' leases, and the server rejoins when restarted.
// Wrong tokens and another cluster's database are refused.
func TestHAServers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: each server runs in a network namespace of its own")
	}
	// Its own bridge, subnet and namespaces: it runs beside the install
	// tests, which mostly wait for systemd in their containers.
	t.Parallel()
	nets := newNodeNetsOn(t, 78, 4)
	db := database(t, func(o dbtest.Options) (*dbtest.DB, error) {
		o.Host = nets[0].hostIP
		return dbtest.Postgres(o)
	}, false)
	// One set of ports for every server: the apiservers' endpoint
	// reconciler publishes one port for all of them.
	ports := []int{freePort(t), freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)}
	newHA := func(i int, extra ...string) *server {
		return newHAServer(t, nets[i], ports, append([]string{"--datastore-endpoint=" + db.Endpoint, "--node-name", fmt.Sprintf("server-%d", i)}, extra...)...)
	}
	// The first server has a node of its own; a lost node is NotReady
	// after 20 s, not upstream's 40 s.
	s0 := newHA(0, "--kube-controller-manager-arg=node-monitor-grace-period=20s")
	s0.start()
	c0 := s0.client()
	out, err := nsK3sm(t, nets[0].name, time.Minute, "token", "create", "--data-dir", s0.dataDir, "--description", "servers")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	tok := lastLine(out)

	// Refusals, each before anything is written.
	refused := func(t *testing.T, i int, want string, extra ...string) {
		t.Helper()
		s := newHA(i, extra...)
		start := time.Now()
		out, err := nsK3sm(t, nets[i].name, 2*time.Minute, s.args()...)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("server: %v, want a refusal saying %q:\n%s", err, want, out)
		}
		if strings.Contains(out, tok[strings.LastIndex(tok, ".")+1:]) || strings.Contains(out, dbPassword) {
			t.Errorf("the refusal shows the token's secret or the database's password:\n%s", out)
		}
		// Preflight makes the (empty) directories; no key or record.
		if files, _ := os.ReadDir(filepath.Join(s.dataDir, "server", "tls")); len(files) > 0 {
			t.Errorf("a refused join wrote %d files into server/tls", len(files))
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "server", "datastore.json")); err == nil {
			t.Errorf("a refused join recorded the datastore")
		}
		t.Logf("refused after %s", time.Since(start).Round(time.Millisecond))
	}
	id, secret, _ := strings.Cut(tok[strings.Index(tok, "::")+2:], ".")
	t.Run("wrong secret", func(t *testing.T) {
		refused(t, 1, "does not open", "--token", tok[:strings.Index(tok, "::")+2]+id+"."+strings.Repeat("0", len(secret)))
	})
	t.Run("another CA", func(t *testing.T) {
		refused(t, 1, "another CA", "--token", "K10"+strings.Repeat("0", 64)+tok[strings.Index(tok, "::"):])
	})
	t.Run("other settings", func(t *testing.T) {
		refused(t, 1, "--service-cidr", "--token", tok, "--service-cidr", "10.99.0.0/16", "--cluster-dns", "10.99.0.10")
	})
	t.Run("no datastore", func(t *testing.T) {
		s := newHA(1, "--token", tok)
		args := slices.DeleteFunc(s.args(), func(a string) bool { return strings.HasPrefix(a, "--datastore-endpoint") })
		out, err := nsK3sm(t, nets[1].name, time.Minute, args...)
		if err == nil || !strings.Contains(out, "--token") || !strings.Contains(out, "--datastore-endpoint") {
			t.Fatalf("--token without a datastore: %v\n%s", err, out)
		}
	})
	t.Run("no token", func(t *testing.T) {
		refused(t, 1, "give --token")
	})
	t.Run("another cluster's token", func(t *testing.T) {
		// A well-formed token of the right CA that no server made: as a
		// token of another cluster is to this database.
		refused(t, 1, "no server of the cluster", "--token", tok[:strings.Index(tok, "::")+2]+"zzzzzz."+secret)
	})
	if t.Failed() {
		return
	}

	// Two more servers, without nodes, join with the token alone.
	s1 := newHA(1, "--token", tok, "--disable-agent")
	s2 := newHA(2, "--token", tok, "--disable-agent")
	s1.start()
	s2.start()
	c1, c2 := s1.client(), s2.client()
	for _, f := range []string{"server-ca.crt", "server-ca.key", "client-ca.key", "request-header-ca.key", "service-account.key"} {
		a, _ := os.ReadFile(filepath.Join(s0.dataDir, "server", "tls", f))
		b, _ := os.ReadFile(filepath.Join(s2.dataDir, "server", "tls", f))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("server-2's %s is not the cluster's", f)
		}
	}
	waitFor(t, time.Minute, "the kubernetes Service's endpoints list the three servers", func() error {
		got, err := apiEndpoints(c2)
		if err != nil {
			return err
		}
		want := []string{nets[0].nsIP, nets[1].nsIP, nets[2].nsIP}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%v, want %v", got, want)
		}
		return nil
	})
	// A token made on another server joins the same cluster: its CA
	// hash is the first one's.
	out, err = nsK3sm(t, nets[2].name, time.Minute, "token", "create", "--data-dir", s2.dataDir, "--ttl", "1h")
	if err != nil {
		t.Fatalf("token create on server-2: %v\n%s", err, out)
	}
	if tok2 := lastLine(out); tok2[:strings.Index(tok2, "::")] != tok[:strings.Index(tok, "::")] {
		t.Errorf("token create on server-2 pins another CA: %s vs %s", tok2, tok)
	}
	// status on a server without a node says so, healthy.
	sout, err := nsK3sm(t, nets[1].name, time.Minute, "status", "--data-dir", s1.dataDir)
	if err != nil || !strings.Contains(sout, "--disable-agent") {
		t.Errorf("status of server-1: %v\n%s", err, sout)
	}

	// An agent, joined through the first server, with a pod.
	agentDir := newDataDir(t, "k3sm-e2e-agent-")
	loadProgImage(t, agentDir)
	a := &agentProc{t: t, dataDir: agentDir, ns: nets[3].name, args: []string{"--server", fmt.Sprintf("https://%s:%d", nets[0].nsIP, ports[4]),
		"--token", tok, "--node-name", "agent-1", "--kubelet-port", strconv.Itoa(freePort(t)), testEvictionHard}}
	a.start()
	t.Cleanup(a.stop)
	a.waitUp()
	var lbState struct {
		Servers []string `json:"servers"`
	}
	waitFor(t, 30*time.Second, "the agent's balancer knows the three servers", func() error {
		data, err := os.ReadFile(filepath.Join(agentDir, "agent", "apiservers.json"))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &lbState); err != nil {
			return fmt.Errorf("%v: %s", err, data)
		}
		if len(lbState.Servers) != 3 {
			return fmt.Errorf("%s", data)
		}
		return nil
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-agent"}, Spec: nativeSpec("e2e.local/prog:v1", "forever")}
	pod.Spec.NodeName, pod.Spec.Containers[0].ImagePullPolicy = "agent-1", corev1.PullNever
	if _, err := c1.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c1.CoreV1().Pods("default").Delete(context.Background(), "on-agent", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	var before *corev1.Pod
	waitFor(t, time.Minute, "pod on-agent Running", func() error {
		p, err := c1.CoreV1().Pods("default").Get(ctx(t), "on-agent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		before = p
		return running(p)
	})

	// The first server holds the leases (it started first): kill -9 it and
	// every process it started, as a lost machine, while 1,000 writes go
	// through a balancer over the three servers.
	holder := func(lease string) string {
		l, err := c2.CoordinationV1().Leases("kube-system").Get(ctx(t), lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	cmHolder := holder("kube-controller-manager")
	if cmHolder == "" {
		t.Errorf("no kube-controller-manager lease: leader election is off")
	}
	writesAcrossKill(t, []*server{s0, s1, s2}, s1, func() { killTree(t, s0.cmd.Process.Pid) })

	// The controllers' leases move to a server that runs.
	waitFor(t, time.Minute, "the kube-controller-manager lease held by another server", func() error {
		if h := holder("kube-controller-manager"); h == "" || h == cmHolder {
			return fmt.Errorf("held by %q", h)
		}
		return nil
	})
	// The agent stays Ready past the node grace period, its lease renewed
	// through its balancer, and its pod untouched.
	time.Sleep(25 * time.Second)
	n, err := c2.CoreV1().Nodes().Get(ctx(t), "agent-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
			t.Errorf("agent-1 not Ready 25 s after the server was killed: %+v", cond)
		}
	}
	if l, err := c2.CoordinationV1().Leases("kube-node-lease").Get(ctx(t), "agent-1", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if age := time.Since(l.Spec.RenewTime.Time); age > 20*time.Second {
		t.Errorf("agent-1's lease last renewed %s ago", age.Round(time.Second))
	}
	p, err := c2.CoreV1().Pods("default").Get(ctx(t), "on-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := running(p); err != nil || p.UID != before.UID || restarts(p) != restarts(before) {
		t.Errorf("the agent's pod after the kill: %v, uid %s (was %s), restarts %d (was %d)", err, p.UID, before.UID, restarts(p), restarts(before))
	}

	// The killed server starts again from its data dir and rejoins.
	s0.start()
	waitFor(t, time.Minute, "the kubernetes Service's endpoints list the three servers again", func() error {
		got, err := apiEndpoints(c0)
		if err != nil {
			return err
		}
		if len(got) != 3 {
			return fmt.Errorf("%v", got)
		}
		return nil
	})
	if _, err := c0.CoreV1().ConfigMaps("default").Get(ctx(t), "ha-0999", metav1.GetOptions{}); err != nil {
		t.Errorf("the restarted server does not see the writes made while it was down: %v", err)
	}
}

// writesAcrossKill writes 1,000 ConfigMaps with 8 writers through a
// balancer over servers' APIs (each create retried until it succeeds),
// calls kill once 300 are acknowledged, and checks that every
// acknowledged write is read back through via. It logs the failover: the
// first write sent after the kill and acknowledged.
func writesAcrossKill(t *testing.T, servers []*server, via *server, kill func()) {
	t.Helper()
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, net.JoinHostPort(s.apiHost, strconv.Itoa(s.ports[0])))
	}
	lb, err := apilb.New(apilb.Options{Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Servers: addrs})
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	go func() { _ = lb.Run(lctx) }()
	rc := via.restConfig()
	rc.Host = lb.URL()
	rc.Timeout = 5 * time.Second
	lbc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	const total, workers = 1000, 8
	var (
		acked    sync.Map
		nacked   atomic.Int64
		killedAt atomic.Pointer[time.Time]
		firstOK  atomic.Pointer[time.Time]
		next     atomic.Int64
	)
	wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer wcancel()
	var ww sync.WaitGroup
	for range workers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for {
				i := next.Add(1) - 1
				if i >= total || wctx.Err() != nil {
					return
				}
				n := fmt.Sprintf("ha-%04d", i)
				for wctx.Err() == nil {
					sent := time.Now()
					_, err := lbc.CoreV1().ConfigMaps("default").Create(wctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n},
						Data: map[string]string{"i": strconv.FormatInt(i, 10)}}, metav1.CreateOptions{})
					if err == nil || apierrors.IsAlreadyExists(err) {
						// Failover ends with the first write both sent and
						// acknowledged after the kill (not one in flight).
						now := time.Now()
						if k := killedAt.Load(); k != nil && sent.After(*k) {
							firstOK.CompareAndSwap(nil, &now)
						}
						acked.Store(n, true)
						nacked.Add(1)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	waitFor(t, time.Minute, "300 writes acknowledged", func() error {
		if n := nacked.Load(); n < 300 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	killAt := time.Now()
	killedAt.Store(&killAt)
	kill()
	ww.Wait()
	if n := nacked.Load(); n != total {
		t.Fatalf("%d of %d writes acknowledged within 3m of the kill", n, total)
	}
	if f := firstOK.Load(); f != nil {
		t.Logf("failover: first acknowledged write %s after the kill", f.Sub(killAt).Round(time.Millisecond))
	}
	list, err := via.client().CoreV1().ConfigMaps("default").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, cm := range list.Items {
		have[cm.Name] = true
	}
	var lost []string
	acked.Range(func(k, _ any) bool {
		if !have[k.(string)] {
			lost = append(lost, k.(string))
		}
		return true
	})
	sort.Strings(lost)
	if len(lost) > 0 {
		t.Errorf("%d acknowledged writes lost, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

// newHAServer prepares a server in node namespace nn, listening on all its
// addresses and advertising nn's; ports are shared by the servers of a
// cluster (the apiservers publish one port for all).
func newHAServer(t *testing.T, nn *nodeNet, ports []int, extra ...string) *server {
	s := newServer(t, append([]string{"--bind-address=0.0.0.0", "--advertise-address=" + nn.nsIP}, extra...)...)
	s.ports, s.defaultAddrs, s.apiHost = ports, true, nn.nsIP
	s.wrap = []string{"ip", "netns", "exec", nn.name}
	return s
}

// lastLine is a command's last line of output (token create prints the
// token last).
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// apiEndpoints are the ready addresses of the kubernetes Service, sorted.
func apiEndpoints(c kubernetes.Interface) ([]string, error) {
	sls, err := c.DiscoveryV1().EndpointSlices("default").List(context.Background(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, sl := range sls.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				ips = append(ips, ep.Addresses...)
			}
		}
	}
	sort.Strings(ips)
	return ips, nil
}

// killTree sends SIGKILL to pid and every process descended from it, at
// once, as a machine that is lost.
func killTree(t *testing.T, pid int) {
	t.Helper()
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		// A Go process forks from any of its threads: each lists its own.
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pids[i]))
		for _, f := range files {
			data, _ := os.ReadFile(f)
			for _, w := range strings.Fields(string(data)) {
				if c, err := strconv.Atoi(w); err == nil && !slices.Contains(pids, c) {
					pids = append(pids, c)
				}
			}
		}
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	t.Logf("killed %d processes of the server (pid %d)", len(pids), pid)
}
