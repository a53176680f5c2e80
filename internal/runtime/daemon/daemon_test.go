package daemon

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

func TestIntegrationPodRunsAndLogs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	info, err := e.c.Runtime.GetRuntimeInfo(ctx, &runtimev1.GetRuntimeInfoRequest{})
	if err != nil || info.GetApiVersion() != "v1" || info.GetCpuCores() < 1 || info.GetMemoryBytes() <= 0 {
		t.Fatalf("runtime info %v %v", info, err)
	}
	t.Logf("runtime: %s/%s kernel %s, pod roots materialized by %s", info.GetOs(), info.GetArch(), info.GetKernelVersion(), info.GetCloneMethod())
	// The socket is private.
	sfi, _ := os.Stat(datadir.New(e.dir).RuntimeSocket())
	dfi, _ := os.Stat(filepath.Dir(datadir.New(e.dir).RuntimeSocket()))
	if sfi.Mode().Perm() != 0o600 || dfi.Mode().Perm() != 0o700 {
		t.Errorf("socket mode %v in dir mode %v, want 0600 in 0700", sfi.Mode().Perm(), dfi.Mode().Perm())
	}

	spec := e.podSpec("hello", "echo:hello from k3sm", "err:to stderr", "sleep:50ms", "env:FROM_IMAGE", "env:MY_VAR", "env:DERIVED", "pwd", "forever")
	spec.Containers[0].Env = []*runtimev1.EnvVar{{Name: "MY_VAR", Value: "x"}, {Name: "DERIVED", Value: "$(MY_VAR)-y"}}
	e.create(spec)
	st := e.waitFor(spec.Uid, "Running", 30*time.Second, running)
	cs := st.GetContainerStatuses()[0]
	if !cs.GetReady() || !cs.GetStarted() || !st.GetContainersReady() || !st.GetInitialized() {
		t.Errorf("running container not ready: %s", prettyStatus(st))
	}
	if !strings.HasPrefix(cs.GetImageId(), e.reg.Host+"/prog@sha256:") || !strings.HasPrefix(cs.GetImageDigest(), "sha256:") ||
		!strings.HasPrefix(cs.GetContainerId(), "k3sm://") {
		t.Errorf("image id %q digest %q container id %q", cs.GetImageId(), cs.GetImageDigest(), cs.GetContainerId())
	}

	got := e.waitLog(spec.Uid, "pwd=")
	// The image is the container's "/" (the sandbox): its working dir is
	// the image's own /app.
	root := ""
	got = strings.Replace(got, "to stderr\n", "", 1) // its own pipe: order against stdout is not defined
	want := "hello from k3sm\nFROM_IMAGE=yes\nMY_VAR=x\nDERIVED=x-y\npwd=" + root + "/app\n"
	if got != want {
		t.Errorf("logs:\n%q\nwant\n%q", got, want)
	}
	// The CRI file on disk.
	raw, err := os.ReadFile(filepath.Join(e.dir, "logs", "pods", "default_hello_"+spec.Uid, "main", "0.log"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\S+Z (stdout|stderr) F .*$`)
	if n := len(re.FindAllString(string(raw), -1)); n != 6 {
		t.Errorf("CRI log has %d well-formed records, want 6:\n%s", n, raw)
	}
	if !strings.Contains(string(raw), " stderr F to stderr\n") {
		t.Errorf("stderr record missing:\n%s", raw)
	}
	tail, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "main", TailLines: ptr(int64(2)), Timestamps: true})
	if lines := strings.Split(strings.TrimSpace(tail), "\n"); len(lines) != 2 || !regexp.MustCompile(`^\d{4}-\S+Z DERIVED=x-y$`).MatchString(lines[0]) {
		t.Errorf("tail 2 with timestamps: %q", tail)
	}
	future := time.Now().Add(time.Hour)
	if s, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, SinceTime: tsp(future)}); s != "" {
		t.Errorf("since the future: %q", s)
	}
	if s, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, LimitBytes: ptr(int64(5))}); s != "hello" && s != "to st" {
		t.Errorf("limit 5 bytes: %q", s)
	}
	if _, err := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Previous: true}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("previous of a first attempt: %v", err)
	}

	// Stats from /proc.
	sr, err := e.c.Runtime.ListPodStats(ctx, &runtimev1.ListPodStatsRequest{PodUid: spec.Uid})
	if err != nil || len(sr.GetPods()) != 1 || len(sr.GetPods()[0].GetContainers()) != 1 {
		t.Fatalf("stats %v %v", sr, err)
	}
	if c := sr.GetPods()[0].GetContainers()[0]; c.GetMemoryWorkingSetBytes() == 0 || c.GetProcessCount() != 1 {
		t.Errorf("container stats %v", c)
	}

	// Non-TTY exec with stdin, output streams and the exit code.
	ex, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ex.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: &runtimev1.ExecStart{PodUid: spec.Uid, Container: "main",
		Command: []string{"prog", "pwd", "err:on stderr", "cat", "exit:3"}, Stdin: true}}})
	ex.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Stdin{Stdin: []byte("from stdin\n")}})
	ex.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_CloseStdin{CloseStdin: true}})
	var out, errOut strings.Builder
	var exit *runtimev1.ExitStatus
	for {
		m, err := ex.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out.Write(m.GetStdout())
		errOut.Write(m.GetStderr())
		if m.GetExit() != nil {
			exit = m.GetExit()
		}
	}
	if exit.GetExitCode() != 3 || out.String() != "pwd="+root+"/app\nfrom stdin\n" || errOut.String() != "on stderr\n" {
		t.Errorf("exec: exit %v stdout %q stderr %q", exit, out.String(), errOut.String())
	}
	// TTY exec and attach: stdio_test.go.

	// Port-forward reaches a port on the pod's (the node's) network.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(c)
		c.Write([]byte("echo:" + string(b)))
		c.Close()
	}()
	if fwd := e.portForward(spec.Uid, int32(ln.Addr().(*net.TCPAddr).Port), []byte("ping")); fwd != "echo:ping" {
		t.Errorf("port-forward got %q", fwd)
	}

	// Follow: a pod printing as it goes; follow ends when it exits.
	spec2 := e.podSpec("ticker", "echo:one", "sleep:300ms", "echo:two", "sleep:300ms", "echo:three", "exit:0")
	spec2.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	e.create(spec2)
	e.waitFor(spec2.Uid, "Running", 30*time.Second, running)
	t0 := time.Now()
	followed, err := e.logs(&runtimev1.GetLogsRequest{PodUid: spec2.Uid, Follow: true})
	if err != nil || followed != "one\ntwo\nthree\n" {
		t.Errorf("follow: %q %v", followed, err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("follow returned after %s, before the program finished", d)
	}

	// image: native runs a host command directly.
	spec3 := &runtimev1.PodSpec{Uid: "native-" + spec.Uid[:8], Namespace: "default", Name: "native",
		Containers: []*runtimev1.ContainerSpec{{Name: "sh", Image: "native", Command: []string{"/bin/sh", "-c", "echo native on $HOSTNAME in $PWD; sleep 100"}}}}
	e.create(spec3)
	e.waitFor(spec3.Uid, "Running", 30*time.Second, running)
	// In the sandbox its private directory is at /run/k3sm-pod (the data
	// dir is closed to the pod's ids), and it runs as root of its own range.
	e.waitLog(spec3.Uid, "native on native in /run/k3sm-pod\n")
	if fi, err := os.Stat(filepath.Join(e.dir, "pods", spec3.Uid, "roots", "sh")); err != nil || fi.Sys().(*syscall.Stat_t).Uid < 1<<30 {
		t.Errorf("the native container's private directory is not its own: %v %v", fi, err)
	}
}

func ptr[T any](v T) *T { return &v }
