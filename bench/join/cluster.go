//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/k3sm-dev/k3sm/bench/internal/execfile"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// serverIP is the server's end of the benchmark's own network (on a
	// bridge in the benchmark's namespace), agentIP every agent's.
	serverIP = "192.168.77.1"
	agentIP  = "192.168.77.2"
	prefix   = "/24"
	// evictionHard keeps the machine's free disk out of the way: below
	// the default thresholds it would taint the nodes DiskPressure.
	evictionHard     = "--eviction-hard=nodefs.available<1Mi,imagefs.available<1Mi,nodefs.inodesFree<1%"
	serverNode       = "bench-server"
	agentKubeletPort = 10250 // in the agent's own namespace
	joinTimeout      = 3 * time.Minute
	// Log lines: the server's, and the agent's (slog text).
	serverUp    = "k3sm is up"
	agentJoined = "msg=joined"
	agentUp     = `msg="k3sm agent is up"`
)

// binaries are copied beside the private k3sm; k3sm-helm too, if there.
var binaries = []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd"}

// bench is one run: what it started and made, for cleanup.
type bench struct {
	work      string
	id        int // this process's pid: names the links and namespaces
	serverDir string
	supPort   int
	server    *child
	agent     *child // the running agent
	c         kubernetes.Interface
	links     []string // in this namespace
	netns     []string
}

// round is one join's figures, from just before `ip netns exec` ran.
type round struct {
	N                 int
	Node              string
	Joined, Ready, Up time.Duration
}

// ownNetns refuses to run in the machine's network namespace or in one
// that has more than a loopback: the benchmark's servers listen on
// 0.0.0.0 and run pod networks.
func ownNetns() error {
	// Where pid 1's namespace can be read (not in every sandbox), it must
	// not be this one; either way, one holding only lo is one of ours.
	self, err1 := os.Readlink("/proc/self/ns/net")
	initNS, err2 := os.Readlink("/proc/1/ns/net")
	if err1 == nil && err2 == nil && self == initNS {
		return errors.New("not in a network namespace of its own: run it through `bench/run.sh join` (unshare --net)")
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		if i.Name != "lo" {
			return fmt.Errorf("this network namespace has %s: run it in a fresh one (`bench/run.sh join` does: unshare --net)", i.Name)
		}
	}
	return ip("link", "set", "lo", "up")
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// makeLAN makes the bridge that stands for the machines' network, with
// the server's address on it; each agent's veth is plugged into it. The
// address stays while agents come and go.
func (b *bench) makeLAN() error {
	br := fmt.Sprintf("kbj%dbr", b.id)
	b.links = append(b.links, br)
	for _, args := range [][]string{
		{"link", "add", br, "type", "bridge"},
		{"addr", "add", serverIP + prefix, "dev", br},
		{"link", "set", br, "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// plugIn makes round i's agent a machine: a network namespace of its own,
// joined to the bridge by a veth pair. It returns the namespace's name.
func (b *bench) plugIn(i int) (string, error) {
	ns := fmt.Sprintf("k3sm-bench-%d-%d", b.id, i)
	host, peer := fmt.Sprintf("kbj%dh%d", b.id, i), fmt.Sprintf("kbj%da%d", b.id, i)
	b.netns = append(b.netns, ns)
	if err := ip("netns", "add", ns); err != nil {
		return "", err
	}
	b.links = append(b.links, host)
	for _, args := range [][]string{
		{"link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns},
		{"link", "set", host, "master", fmt.Sprintf("kbj%dbr", b.id)},
		{"link", "set", host, "up"},
		{"-n", ns, "addr", "add", agentIP + prefix, "dev", peer},
		{"-n", ns, "link", "set", peer, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			return "", err
		}
	}
	return ns, nil
}

// unplug deletes round i's veth pair and namespace.
func (b *bench) unplug(i int) error {
	host, ns := fmt.Sprintf("kbj%dh%d", b.id, i), fmt.Sprintf("k3sm-bench-%d-%d", b.id, i)
	_ = ip("link", "del", host)
	b.links = slices.DeleteFunc(b.links, func(l string) bool { return l == host })
	if err := ip("netns", "del", ns); err != nil {
		return err
	}
	b.netns = slices.DeleteFunc(b.netns, func(n string) bool { return n == ns })
	return nil
}

// freePorts returns n distinct ports no one listens on, below the
// ephemeral range (an outgoing connection cannot take one meanwhile).
func freePorts(n int) []int {
	given := map[int]bool{}
	var out []int
	for len(out) < n {
		p := 20000 + rand.IntN(10000)
		if given[p] {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			given[p] = true
			out = append(out, p)
		}
	}
	return out
}

func (b *bench) startServer(ctx context.Context, bin string) error {
	b.serverDir = filepath.Join(b.work, "server")
	ports := freePorts(5)
	b.supPort = ports[0]
	args := []string{bin, "server", "--data-dir", b.serverDir,
		"--bind-address", "0.0.0.0", "--advertise-address", serverIP,
		"--supervisor-port", strconv.Itoa(ports[0]),
		"--https-listen-port", strconv.Itoa(ports[1]),
		"--scheduler-port", strconv.Itoa(ports[2]),
		"--controller-manager-port", strconv.Itoa(ports[3]),
		"--kubelet-port", strconv.Itoa(ports[4]),
		"--node-name", serverNode, evictionHard}
	s, err := startChild("server", filepath.Join(b.work, "server.log"), []string{serverUp}, args...)
	if err != nil {
		return err
	}
	b.server = s
	deadline := time.After(4 * time.Minute)
	for {
		if _, ok := s.mark(serverUp); ok {
			break
		}
		select {
		case <-s.marked:
		case <-s.done:
			return s.exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("server not up after 4m; log %s:\n%s", s.logPath, s.tail())
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(b.serverDir, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	rc.UserAgent = "k3sm-bench-join"
	b.c, err = kubernetes.NewForConfig(rc)
	logf("server up in %s", ms(time.Since(s.started)))
	return err
}

// createToken runs `k3sm token create`; its last line is the token.
func createToken(ctx context.Context, bin, dataDir string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "token", "create", "--data-dir", dataDir, "--description", "bench/join")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("k3sm token create: %v: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	tok := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(tok, "K10") {
		return "", fmt.Errorf("k3sm token create printed %q, not a token", out)
	}
	return tok, nil
}

// join runs round i: a fresh agent joins as bench-agent-<i>. The Node is
// watched from before the agent starts, so its Ready is seen as it comes.
func (b *bench) join(ctx context.Context, bin, tok string, i int) (round, error) {
	r := round{N: i, Node: fmt.Sprintf("bench-agent-%d", i)}
	ns, err := b.plugIn(i)
	if err != nil {
		return r, err
	}
	rctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	readyCh, err := watchReady(rctx, b.c, r.Node)
	if err != nil {
		return r, err
	}
	a, err := startChild("agent "+r.Node, filepath.Join(b.work, fmt.Sprintf("agent-%d.log", i)), []string{agentJoined, agentUp},
		"ip", "netns", "exec", ns, bin, "agent",
		"--server", fmt.Sprintf("https://%s:%d", serverIP, b.supPort), "--token", tok,
		"--node-name", r.Node, "--data-dir", filepath.Join(b.work, fmt.Sprintf("agent-%d", i)),
		"--kubelet-port", strconv.Itoa(agentKubeletPort), evictionHard)
	if err != nil {
		return r, err
	}
	b.agent = a
	var readyAt time.Time
	for {
		joinedAt, joined := a.mark(agentJoined)
		upAt, up := a.mark(agentUp)
		if joined && up && !readyAt.IsZero() {
			r.Joined, r.Up, r.Ready = joinedAt.Sub(a.started), upAt.Sub(a.started), readyAt.Sub(a.started)
			return r, nil
		}
		select {
		case t := <-readyCh:
			readyAt, readyCh = t, nil
		case <-a.marked:
		case <-a.done:
			return r, a.exited()
		case <-rctx.Done():
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			return r, fmt.Errorf("%s: after %s: joined %v, Ready %v, up %v; log %s:\n%s",
				r.Node, joinTimeout, joined, !readyAt.IsZero(), up, a.logPath, a.tail())
		}
	}
}

// leave stops round i's agent and removes what its join left (its
// namespace, its Node and node password), so the next join is a fresh one.
func (b *bench) leave(ctx context.Context, i int, node string) error {
	err := b.agent.stop()
	b.agent = nil
	// Not the whole work dir: the server runs from there.
	killLeftovers(filepath.Join(b.work, "agent-bin"), filepath.Join(b.work, fmt.Sprintf("agent-%d", i)))
	if err != nil {
		return err
	}
	if err := b.unplug(i); err != nil {
		return err
	}
	if err := b.c.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// As internal/server/join names it.
	secret := node + ".node-password.k3sm"
	if err := b.c.CoreV1().Secrets("kube-system").Delete(ctx, secret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := b.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s still there 1m after its delete (%v)", node, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// watchReady sends the time node name is first seen Ready=True: a list,
// then a watch from the list's revision (listed and opened again if it
// ends), opened before it returns. It stops with ctx.
func watchReady(ctx context.Context, c kubernetes.Interface, name string) (<-chan time.Time, error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	listWatch := func() (watch.Interface, bool, error) {
		list, err := c.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return nil, false, err
		}
		for i := range list.Items {
			if nodeReady(&list.Items[i]) {
				return nil, true, nil
			}
		}
		wo := opts
		wo.ResourceVersion = list.ResourceVersion
		w, err := c.CoreV1().Nodes().Watch(ctx, wo)
		return w, false, err
	}
	w, ready, err := listWatch()
	if err != nil {
		return nil, err
	}
	if ready {
		return nil, fmt.Errorf("node %s is Ready before its agent started", name)
	}
	out := make(chan time.Time, 1)
	go func() {
		for {
			for ev := range w.ResultChan() {
				if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted && nodeReady(n) {
					w.Stop()
					out <- time.Now()
					return
				}
			}
			// The watch ended (its timeout, an error event): again.
			w.Stop()
			for {
				if sleep(ctx, 50*time.Millisecond) != nil {
					return
				}
				if w, ready, err = listWatch(); ready {
					out <- time.Now()
					return
				} else if err == nil {
					break
				}
			}
		}
	}()
	return out, nil
}

// child is a process the benchmark started, its output (stdout and
// stderr) written to logPath and watched for marker lines.
type child struct {
	name, logPath string
	cmd           *exec.Cmd
	started       time.Time // just before it was executed
	done          chan struct{}
	err           error // its exit, once done is closed
	marked        chan struct{}
	mu            sync.Mutex
	seen          map[string]time.Time
}

func startChild(name, logPath string, markers []string, argv ...string) (*child, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	c := &child{name: name, logPath: logPath, cmd: exec.Command(argv[0], argv[1:]...),
		done: make(chan struct{}), marked: make(chan struct{}, 1), seen: map[string]time.Time{}}
	c.cmd.Stdout, c.cmd.Stderr = w, w
	c.started = time.Now()
	err = c.cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		logFile.Close()
		return nil, err
	}
	go func() {
		defer logFile.Close()
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			now, line := time.Now(), sc.Text()
			_, _ = logFile.WriteString(line + "\n")
			c.mu.Lock()
			for _, m := range markers {
				if _, ok := c.seen[m]; !ok && strings.Contains(line, m) {
					c.seen[m] = now
					select {
					case c.marked <- struct{}{}:
					default:
					}
				}
			}
			c.mu.Unlock()
		}
		// After a line too long to scan: keep the writers from blocking.
		_, _ = io.Copy(logFile, r)
	}()
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// mark says when marker was first seen in the output.
func (c *child) mark(marker string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.seen[marker]
	return t, ok
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) tail() string {
	b, _ := os.ReadFile(c.logPath)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-30):], "\n")
}

// exited returns an error if the process has exited.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited (%v); log %s:\n%s", c.name, c.err, c.logPath, c.tail())
	default:
		return nil
	}
}

// stop sends SIGTERM and waits; it stops its own children.
func (c *child) stop() error {
	if c == nil {
		return nil
	}
	if err := c.exited(); err != nil {
		return err
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not stop within 1m of SIGTERM; killed", c.name)
	}
}

// cleanup stops the agent and the server, kills whatever of theirs is
// left, and removes the namespaces, links and files the run made.
func (b *bench) cleanup() error {
	errs := []error{b.agent.stop(), b.server.stop()}
	if n := killLeftovers(b.work); n > 0 {
		logf("killed %d processes left under %s", n, b.work)
	}
	nsFiles, _ := filepath.Glob(filepath.Join(b.work, "*", "run", "netns", "*"))
	for _, f := range nsFiles {
		_ = syscall.Unmount(f, syscall.MNT_DETACH)
	}
	for i := len(b.links) - 1; i >= 0; i-- {
		_ = ip("link", "del", b.links[i]) // the agents' are gone with their namespaces
	}
	for _, ns := range b.netns {
		errs = append(errs, ip("netns", "del", ns))
	}
	errs = append(errs, os.RemoveAll(b.work))
	return errors.Join(errs...)
}

// killLeftovers SIGKILLs every process that runs from one of dirs or
// names it on its command line, and their children, and returns how many
// it found.
func killLeftovers(dirs ...string) int {
	all := scan()
	var kill []int
	ours := map[int]bool{}
	for _, p := range all {
		for _, dir := range dirs {
			if p.Pid != os.Getpid() && !ours[p.Pid] && (strings.HasPrefix(p.Exe, dir+"/") || strings.Contains(strings.Join(p.Args, " "), dir+"/")) {
				ours[p.Pid] = true
				kill = append(kill, p.Pid)
			}
		}
	}
	for _, p := range all {
		if !ours[p.Pid] && ours[p.PPid] {
			kill = append(kill, p.Pid)
		}
	}
	n := 0
	for _, pid := range kill {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

func copyBinaries(from, to string) (string, error) {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return "", err
	}
	for _, name := range append(binaries, "k3sm-helm") {
		if err := execfile.Copy(filepath.Join(from, name), filepath.Join(to, name)); err != nil {
			if name == "k3sm-helm" && errors.Is(err, os.ErrNotExist) {
				continue // only HelmCharts need it; the benchmark has none
			}
			return "", err
		}
	}
	return filepath.Join(to, "k3sm"), nil
}
