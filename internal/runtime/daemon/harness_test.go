package daemon

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// Built once per test binary.
var (
	shimBin string
	progBin string
)

const subprocessEnv = "K3SM_RUNTIME_TEST_DAEMON_DIR"

// The shim and the test program, prebuilt (test/vm sets both).
const (
	prebuiltShimEnv = "K3SM_RUNTIME_TEST_SHIM_BIN"
	prebuiltProgEnv = "K3SM_RUNTIME_TEST_PROG_BIN"
)

func TestMain(m *testing.M) {
	// Re-exec mode: this test binary acts as a standalone daemon, so a test
	// can kill -9 it.
	if dir := os.Getenv(subprocessEnv); dir != "" {
		os.Exit(subprocessDaemon(dir))
	}
	dir, err := os.MkdirTemp("", "k3sm-bin")
	if err != nil {
		panic(err)
	}
	// Prebuilt where no Go toolchain is (the test VM, test/vm): both, or
	// neither.
	shimBin, progBin = os.Getenv(prebuiltShimEnv), os.Getenv(prebuiltProgEnv)
	if shimBin == "" || progBin == "" {
		shimBin = filepath.Join(dir, "k3sm-shim")
		// Static, as `make` builds it: the sandbox runs it inside pod roots.
		build := exec.Command("go", "build", "-o", shimBin, "github.com/k3sm-dev/k3sm/cmd/k3sm-shim")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build shim: %v\n%s", err, out)
			os.Exit(1)
		}
		if progBin, err = imagetest.BuildProg(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func testConfig(dir string) Config {
	return Config{DataDir: dir, ShimPath: os.Getenv("K3SM_TEST_SHIM"), NetdSocket: os.Getenv("K3SM_TEST_NETD"),
		CrashLoopBackOffBase: 200 * time.Millisecond, CrashLoopBackOffMax: 800 * time.Millisecond,
		ImagePullBackOffBase: 200 * time.Millisecond, ImagePullBackOffMax: 800 * time.Millisecond,
		EmptyDirCheckInterval: 100 * time.Millisecond}
}

func subprocessDaemon(dir string) int {
	if os.Getenv(remountSysEnv) != "" {
		if err := remountSys(); err != nil {
			fmt.Fprintln(os.Stderr, "daemon:", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg := testConfig(dir)
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "daemon:", err)
		return 1
	}
	return 0
}

// env is one test's daemon, registry and image.
type env struct {
	t     *testing.T
	dir   string
	c     *client.Client
	reg   *imagetest.Registry
	image string // the test program, host platform
	stop  func()
	// The last subprocess daemon's log file and exit (startSubprocess).
	daemonLog    string
	daemonExited chan error
	// remountSys: the subprocess daemon runs as under `ip netns exec`
	// (remountSys), without cgroups.
	remountSys bool
}

func integration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test")
	}
	if runtime.GOOS != "linux" {
		t.Skip("integration tests run on Linux")
	}
}

// newBareEnv makes the data dir and the registry with the test image; the
// caller starts the daemon.
func newBareEnv(t *testing.T) *env {
	dir, err := os.MkdirTemp("", "k3sm")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir}
	e.reg = imagetest.StartRegistry(t, "", "")
	img, err := imagetest.Image(progBin, v1.Platform{})
	if err != nil {
		t.Fatal(err)
	}
	e.image = e.reg.Push(t, "prog:v1", img)
	return e
}

// newEnv starts a daemon in process on a fresh data dir (short: socket
// paths are limited) and pushes the test image to a local registry.
func newEnv(t *testing.T) *env { return newEnvWith(t, nil) }

// newEnvWith is newEnv with configure (if not nil) changing the daemon's
// Config first.
func newEnvWith(t *testing.T, configure func(*Config)) *env {
	integration(t)
	e := newBareEnv(t)
	dir := e.dir
	e.startInProcessWith(configure)
	t.Cleanup(func() {
		e.deleteAll()
		e.stop()
		os.RemoveAll(dir)
	})
	return e
}

func (e *env) startInProcess() { e.startInProcessWith(nil) }

// startInProcessWith is startInProcess with configure (if not nil)
// changing the daemon's Config first.
func (e *env) startInProcessWith(configure func(*Config)) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := testConfig(e.dir)
	cfg.ShimPath = shimBin
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if configure != nil {
		configure(&cfg)
	}
	ready := make(chan struct{})
	cfg.OnReady = func() { close(ready) }
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	select {
	case <-ready:
	case err := <-done:
		e.t.Fatalf("daemon: %v", err)
	case <-time.After(30 * time.Second):
		e.t.Fatal("daemon did not become ready")
	}
	e.dial()
	e.stop = func() {
		e.c.Close()
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("daemon: %v", err)
		}
	}
}

func (e *env) dial() {
	c, err := client.Dial(datadir.New(e.dir).RuntimeSocket())
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		why := ""
		if e.daemonLog != "" {
			select {
			case werr := <-e.daemonExited:
				why = fmt.Sprintf("; the daemon exited (%v)", werr)
			default:
			}
			b, _ := os.ReadFile(e.daemonLog)
			why += "; its log:\n" + string(b)
		}
		e.t.Fatalf("daemon not answering: %v%s", err, why)
	}
	e.c = c
}

// startSubprocess runs the daemon as a child process (this test binary).
func (e *env) startSubprocess() *exec.Cmd { return e.startSubprocessShim(shimBin) }

// startSubprocessShim runs the daemon as a child process with shim as its
// k3sm-shim.
func (e *env) startSubprocessShim(shim string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), subprocessEnv+"="+e.dir, "K3SM_TEST_SHIM="+shim)
	if e.remountSys {
		cmd.Env = append(cmd.Env, remountSysEnv+"=1")
		cmd.SysProcAttr = ownMountNamespace()
	}
	// Its log, shown when it does not come up.
	logf, err := os.CreateTemp(e.t.TempDir(), "daemon-*.log")
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = logf
	if testing.Verbose() {
		cmd.Stderr = io.MultiWriter(logf, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e.daemonLog = logf.Name()
	e.daemonExited = exited
	e.dial()
	return cmd
}

func (e *env) deleteAll() {
	if e.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := e.c.Runtime.ListPods(ctx, &runtimev1.ListPodsRequest{})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, p := range resp.GetPods() {
		e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: p.GetUid(), GracePeriodSeconds: &zero, Wait: true})
	}
}

var podSeq int

// podSpec is a one-container pod running the test program with args.
func (e *env) podSpec(name string, args ...string) *runtimev1.PodSpec {
	podSeq++
	return &runtimev1.PodSpec{
		Uid: fmt.Sprintf("%08d-0000-4000-8000-%012d", podSeq, time.Now().UnixNano()%1e12), Namespace: "default", Name: name,
		Containers: []*runtimev1.ContainerSpec{{Name: "main", Image: e.image, Args: args}},
	}
}

func (e *env) create(spec *runtimev1.PodSpec) {
	e.t.Helper()
	e.shareScratch(spec)
	if _, err := e.c.Runtime.CreatePod(context.Background(), &runtimev1.CreatePodRequest{Pod: spec}); err != nil {
		e.t.Fatalf("create %s: %v", spec.GetName(), err)
	}
}

// shareScratch mounts the test's temporary directories (t.TempDir) into
// every container at the same path: a sandboxed pod sees only its image,
// and the test program's ops (pid:, append:, ...) write files the test
// reads on the host.
func (e *env) shareScratch(spec *runtimev1.PodSpec) {
	scratch := filepath.Dir(e.t.TempDir())
	// Open to the pods' ids (a sandboxed pod runs as ids of its own
	// range; t.TempDir makes 0700 directories).
	filepath.WalkDir(scratch, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o777)
		}
		return nil
	})
	for _, v := range spec.GetVolumes() {
		if v.GetName() == "test-scratch" {
			return
		}
	}
	spec.Volumes = append(spec.Volumes, &runtimev1.Volume{Name: "test-scratch",
		Source: &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{Path: scratch}}})
	for _, c := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		c.VolumeMounts = append(c.VolumeMounts, &runtimev1.VolumeMount{Name: "test-scratch", MountPath: scratch})
	}
}

func (e *env) status(uid string) *runtimev1.PodStatus {
	e.t.Helper()
	r, err := e.c.Runtime.GetPodStatus(context.Background(), &runtimev1.GetPodStatusRequest{Uid: uid})
	if err != nil {
		e.t.Fatalf("status %s: %v", uid, err)
	}
	return r.GetStatus()
}

// waitFor polls the pod's status until cond holds.
func (e *env) waitFor(uid string, what string, timeout time.Duration, cond func(*runtimev1.PodStatus) bool) *runtimev1.PodStatus {
	e.t.Helper()
	var st *runtimev1.PodStatus
	poll.UntilNil(e.t, timeout, fmt.Sprintf("pod %s: %s", uid, what), func() error {
		if st = e.status(uid); !cond(st) {
			return lastStatus{st}
		}
		return nil
	})
	return st
}

// lastStatus is the status waitFor saw last, formatted only if the wait
// fails.
type lastStatus struct{ st *runtimev1.PodStatus }

func (l lastStatus) Error() string { return "last status:\n" + prettyStatus(l.st) }

func prettyStatus(st *runtimev1.PodStatus) string {
	if st == nil {
		return "<nil>"
	}
	return prototext.Format(st)
}

func running(st *runtimev1.PodStatus) bool {
	return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_RUNNING && len(st.GetContainerStatuses()) > 0 &&
		st.GetContainerStatuses()[0].GetState().GetRunning() != nil
}

func (e *env) logs(req *runtimev1.GetLogsRequest) (string, error) {
	stream, err := e.c.Runtime.GetLogs(context.Background(), req)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return b.String(), nil
		}
		if err != nil {
			return b.String(), err
		}
		b.Write(m.GetData())
	}
}

// waitLog polls GetLogs until it contains want.
func (e *env) waitLog(uid, want string) string {
	e.t.Helper()
	var got string
	poll.UntilNil(e.t, 5*time.Second, fmt.Sprintf("%q in the log of %s", want, uid), func() error {
		if got, _ = e.logs(&runtimev1.GetLogsRequest{PodUid: uid}); !strings.Contains(got, want) {
			return fmt.Errorf("got:\n%s", got)
		}
		return nil
	})
	return got
}

func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie is not alive.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || !strings.HasPrefix(string(b[i+1:]), " Z")
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	var b []byte
	poll.Until(t, 5*time.Second, "a pid in "+path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0 && (len(strings.Fields(string(b))) > 1 || !strings.Contains(string(b), "pid:"))
	})
	pid, err := imagetest.HostPid(string(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

func tsp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// newSubprocessEnv is the set-up of the tests that kill -9 a daemon run as
// a subprocess: a short data dir (unix socket paths) the test removes, and
// the test image in a registry on 127.0.0.1. It skips unless integration
// tests run.
func newSubprocessEnv(t *testing.T) *env {
	t.Helper()
	integration(t)
	dir, err := os.MkdirTemp("", "k3sm")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir}
	e.reg = imagetest.StartRegistry(t, "", "")
	img, _ := imagetest.Image(progBin, v1.Platform{})
	e.image = e.reg.Push(t, "prog:v1", img)
	return e
}

// portForward sends data through PortForward to the pod's port, closes
// the writing side and returns what came back; an error the stream
// reports fails the test.
func (e *env) portForward(uid string, port int32, data []byte) string {
	e.t.Helper()
	pf, err := e.c.Runtime.PortForward(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	pf.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_Start{Start: &runtimev1.PortForwardStart{PodUid: uid, Port: port}}})
	if len(data) > 0 {
		pf.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_Data{Data: data}})
	}
	pf.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_CloseWrite{CloseWrite: true}})
	var out strings.Builder
	for {
		m, err := pf.Recv()
		if err != nil {
			break
		}
		out.Write(m.GetData())
		if m.GetError() != "" {
			e.t.Errorf("port-forward to %s:%d: %s", uid, port, m.GetError())
		}
	}
	return out.String()
}
