// Package e2e starts the real k3sm binary on temporary data directories,
// with every port on 127.0.0.1, and checks it through client-go and kubectl.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/ports"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

var k3smBin string

// inNetNSEnv marks a test process already re-executed in a network
// namespace of its own.
const inNetNSEnv = "K3SM_E2E_NETNS"

func TestMain(m *testing.M) {
	k3smBin = os.Getenv("K3SM_BIN")
	if k3smBin == "" {
		fmt.Println("e2e: K3SM_BIN is not set; build with `make bin/k3sm` and run `make test-e2e` (skipping)")
		os.Exit(0)
	}
	if os.Geteuid() == 0 && os.Getenv(inNetNSEnv) == "" {
		// The tests run where only lo exists: what they take from Debian's
		// mirror is fetched first, from here.
		if err := imagetest.FetchNginxPackages(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: Debian's nginx packages (the nginx specs will fail): %v\n", err)
		}
		os.Exit(reexecInNetNS())
	}
	os.Exit(m.Run())
}

// reexecInNetNS runs this test binary again in a new network namespace that
// has only lo: as root, servers give pods addresses of their own
// (100.64.0.0/10) and Service addresses, and every packet to them must stay
// in a namespace the test made, never reach the machine's real network.
func reexecInNetNS() int {
	cmd := exec.Command("unshare", append([]string{"--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`}, os.Args...)...)
	cmd.Env = append(os.Environ(), inNetNSEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "e2e: cannot run in a network namespace of its own (unshare --net, ip from iproute2): %v\n", err)
		return 1
	}
	return 0
}

// server is one running `k3sm server`.
type server struct {
	t        *testing.T
	dataDir  string
	port     int
	ports    []int
	cmd      *exec.Cmd
	out      *bytes.Buffer
	waitErr  chan error
	extra    []string
	exitCode int
	// bin (default k3smBin), attr and env (appended to this process's)
	// start the server as another user (TestRootlessServer).
	bin  string
	attr *syscall.SysProcAttr
	env  []string
	// wrap runs the server through a command that execs it (unshare ...
	// --), as `ip netns exec` or a unit's sandboxing would.
	wrap []string
	// apiHost, when set, is the address the test reaches the apiserver
	// on instead of the kubeconfig's 127.0.0.1 (a server in a network
	// namespace of its own, whose loopback is not the test's).
	apiHost string
	// defaultAddrs leaves --bind-address and --advertise-address out, so
	// the server picks the node's address by its own rule (the test runs
	// in a network namespace of its own: only lo, and what k3sm adds).
	defaultAddrs bool
}

// freePort returns a loopback port no one listens on (package ports).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newServer prepares a server on a fresh data dir with loopback-only ports.
func newServer(t *testing.T, extra ...string) *server {
	t.Helper()
	dir := newDataDir(t, "k3sm-e2e-")
	return &server{t: t, dataDir: dir, ports: []int{freePort(t), freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)}, extra: extra}
}

// newDataDir makes a node's data dir (a server's or an agent's), and at
// the test's end ends what runs from it and removes it (kept when the
// test failed).
func newDataDir(t *testing.T, prefix string) string {
	t.Helper()
	// Short path: unix sockets live under the data dir.
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Pods outlive the server by design; a test must not leave them running.
		if n := killLeftovers(dir); n > 0 {
			t.Logf("killed %d pod processes left under %s", n, dir)
		}
		// Pod network namespaces netd left bound (pods the test did not
		// delete): unbound, the files can be removed.
		nsFiles, _ := filepath.Glob(filepath.Join(dir, "run", "netns", "*"))
		for _, f := range nsFiles {
			unmountDetach(f)
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("data dir kept for inspection: %s", dir)
		}
	})
	return dir
}

// testEvictionHard keeps the disk thresholds out of a test's way: the
// machine's own free space must not decide it (a shared disk under 15%
// free would taint the node with DiskPressure).
const testEvictionHard = "--eviction-hard=nodefs.available<1Mi,imagefs.available<1Mi,nodefs.inodesFree<1%"

func (s *server) args() []string {
	s.port = s.ports[0]
	extra := s.extra
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--eviction-hard") }) {
		// The disk test sets the kubelet's thresholds on a tmpfs of its own.
		extra = append([]string{testEvictionHard}, extra...)
	}
	args := []string{"server", "--data-dir", s.dataDir,
		"--https-listen-port", strconv.Itoa(s.ports[0]),
		"--scheduler-port", strconv.Itoa(s.ports[1]),
		"--controller-manager-port", strconv.Itoa(s.ports[2]),
		"--kubelet-port", strconv.Itoa(s.ports[3]),
		"--node-name", "e2e-node"}
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--supervisor-port") }) {
		// Servers of one test run side by side (a shared datastore).
		args = append(args, "--supervisor-port", strconv.Itoa(s.ports[4]))
	}
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--mesh-port") }) {
		// The mesh device's UDP port: the same reason (a number free for
		// TCP is, in practice, free for UDP too).
		args = append(args, "--mesh-port", strconv.Itoa(s.ports[5]))
	}
	if !s.defaultAddrs {
		args = append(args, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1")
	}
	return append(args, extra...)
}

// start launches the server and waits until it says it is up.
func (s *server) start() {
	s.t.Helper()
	bin := k3smBin
	if s.bin != "" {
		bin = s.bin
	}
	s.cmd = exec.Command(bin, s.args()...)
	if len(s.wrap) > 0 {
		s.cmd = exec.Command(s.wrap[0], append(append(s.wrap[1:], bin), s.args()...)...)
	}
	if s.attr != nil {
		s.cmd.SysProcAttr = s.attr
		s.cmd.Dir = "/"
	}
	if s.env != nil {
		s.cmd.Env = append(os.Environ(), s.env...)
	}
	s.out = &bytes.Buffer{}
	// One writer for both: two would each lock only themselves.
	lw := &lockedWriter{w: s.out}
	s.cmd.Stdout, s.cmd.Stderr = lw, lw
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.waitErr = make(chan error, 1)
	go func() { s.waitErr <- s.cmd.Wait() }()
	s.t.Cleanup(func() { s.stop() })
	deadline := time.After(4 * time.Minute)
	for !strings.Contains(s.output(), "k3sm is up") {
		select {
		case err := <-s.waitErr:
			s.waitErr <- err
			s.t.Fatalf("server exited before it was up (%v):\n%s", err, s.output())
		case <-deadline:
			s.t.Fatalf("server not up after 4m:\n%s", s.output())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// "Up" means usable at once: a first pod in default needs the default
	// ServiceAccount and kube-root-ca.crt, and is refused without them. No
	// waiting here, so every e2e test checks it.
	if _, err := s.client().CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		s.t.Fatalf("server said it is up, but a pod cannot be created yet: %v", err)
	}
	if _, err := s.client().CoreV1().ConfigMaps("default").Get(context.Background(), "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		s.t.Fatalf("server said it is up, but kube-root-ca.crt is missing: %v", err)
	}
}

// stop sends SIGTERM and waits for the server to exit.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waitErr:
	case <-time.After(time.Minute):
		s.t.Errorf("server did not stop within 1m after SIGTERM")
		_ = s.cmd.Process.Kill()
		<-s.waitErr
	}
}

func (s *server) output() string {
	if lw, ok := s.cmd.Stdout.(*lockedWriter); ok {
		return lw.String()
	}
	return ""
}

func (s *server) kubeconfig() string { return filepath.Join(s.dataDir, "admin.kubeconfig") }

func (s *server) restConfig() *rest.Config {
	s.t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig())
	if err != nil {
		s.t.Fatal(err)
	}
	rc.QPS, rc.Burst = 100, 200
	if s.apiHost != "" {
		rc.Host = "https://" + net.JoinHostPort(s.apiHost, strconv.Itoa(s.ports[0]))
	}
	return rc
}

func (s *server) client() kubernetes.Interface {
	s.t.Helper()
	c, err := kubernetes.NewForConfig(s.restConfig())
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// kubectl runs the embedded kubectl against this server.
func (s *server) kubectl(args ...string) (string, error) {
	cmd := exec.Command(k3smBin, append([]string{"kubectl", "--kubeconfig", s.kubeconfig()}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// childPids returns the pids of this server's children running role: a
// hidden role of k3sm (argv[1]), or runtimed, a binary of its own.
func (s *server) childPids(role string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 2 || (args[1] != role && filepath.Base(args[0]) != "k3sm-"+role) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(stat), ") Z ") {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, s.dataDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFor is poll.Every at the pace of these tests, which ask a live
// server: cond every 100 ms until it returns nil, failing the test when
// timeout passes first.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	poll.Every(t, context.Background(), timeout, 100*time.Millisecond, what, cond)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// killLeftovers SIGKILLs every process that runs from dir or names it on its
// command line (workloads and their shims) and returns how many it found.
func killLeftovers(dir string) int {
	// The shims (their state dirs are under dir) and the workloads they
	// started: a sandboxed workload runs its image's program (or a host
	// one, for image: native), so only its parent names the data dir.
	// Killing a workload, pid 1 of its pod's pid namespace, ends the rest
	// of that namespace with it.
	shims := map[string]bool{}
	var kill []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.HasPrefix(exe, dir+"/") || strings.Contains(string(cmdline), dir+"/") {
			shims[e.Name()] = true
			kill = append(kill, pid)
		}
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || shims[e.Name()] {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 1 && shims[f[1]] {
			kill = append(kill, pid)
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

// createPod creates a pod in the default namespace.
func (s *server) createPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	shareScratch(t, &p.Spec)
	if _, err := s.client().CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// shareScratch mounts the test's temporary directories (t.TempDir) into
// every container at the same path: a pod sees only its image, and the
// test program's ops (pid:, append:, ...) write files the test reads.
func shareScratch(t *testing.T, spec *corev1.PodSpec) {
	scratch := filepath.Dir(t.TempDir())
	// Open to the pods' ids (a sandboxed pod runs as ids of its own
	// range; t.TempDir makes 0700 directories).
	filepath.WalkDir(scratch, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o777)
		}
		return nil
	})
	for _, v := range spec.Volumes {
		if v.Name == "test-scratch" {
			return
		}
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "test-scratch",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: scratch}}})
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			cs[i].VolumeMounts = append(cs[i].VolumeMounts, corev1.VolumeMount{Name: "test-scratch", MountPath: scratch})
		}
	}
}

// deletePod deletes a pod with the given grace period and waits until it is gone.
func (s *server) deletePod(t *testing.T, name string, grace int64) {
	t.Helper()
	c := s.client()
	if err := c.CoreV1().Pods("default").Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, name, time.Minute)
}

// deletePodsAtCleanup deletes every pod in default when the test ends, while
// the server still runs (pods outlive the server by design), and waits up
// to a minute for their processes to go.
func (s *server) deletePodsAtCleanup(t *testing.T) {
	c := s.client()
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		// Not poll: a cleanup that waits at most this long, failing nothing.
		deadline := time.Now().Add(time.Minute)
		for len(s.workloadPids()) > 0 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
	})
}
