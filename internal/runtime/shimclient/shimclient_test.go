package shimclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

var shimBin string

// pidnsShimEnv passes the built shim to a re-executed test binary
// (pidns_linux_test.go).
const pidnsShimEnv = "K3SM_SHIMCLIENT_TEST_SHIM"

func TestMain(m *testing.M) {
	if bin := os.Getenv(pidnsShimEnv); bin != "" {
		// A re-executed child (pidns_test.go): the parent built the shim.
		shimBin = bin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "k3sm-shimbin")
	if err != nil {
		panic(err)
	}
	shimBin = filepath.Join(dir, "k3sm-shim")
	// Static, as `make` builds it: the sandbox runs it inside pod roots.
	build := exec.Command("go", "build", "-o", shimBin, "github.com/k3sm-dev/k3sm/cmd/k3sm-shim")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build shim: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newStarter(t *testing.T) (*Starter, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "k3sm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	os.Mkdir(sock, 0o700)
	return &Starter{ShimPath: shimBin, SocketDir: sock}, dir
}

func spec(dir, id string, argv ...string) pod.ProcessSpec {
	return pod.ProcessSpec{ID: id, Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir,
		LogPath: filepath.Join(dir, "logs", id, "0.log"), StateDir: filepath.Join(dir, "state", id)}
}

func TestShimRunsProcessAndRecordsExit(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	p, err := s.Start(ctx, spec(dir, "a", "/bin/sh", "-c", "echo hello; echo oops >&2; printf partial; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	es, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if es.ExitCode != 3 || es.Unknown || es.FinishedAt.Before(es.StartedAt) {
		t.Fatalf("exit status %+v", es)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "logs", "a", "0.log"))
	for _, want := range []string{" stdout F hello\n", " stderr F oops\n", " stdout F partial\n"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// The exit status is on disk for a daemon that was not there.
	rec, err := shim.ReadExit(filepath.Join(dir, "state", "a"))
	if err != nil || rec.ExitCode != 3 {
		t.Fatalf("exit file: %+v %v", rec, err)
	}
	// Attaching after the shim left answers from the file.
	time.Sleep(100 * time.Millisecond)
	p2, alive, err := s.Attach(filepath.Join(dir, "state", "a"))
	if alive {
		t.Error("attach after exit says running")
	}
	if err != nil {
		t.Fatal(err)
	}
	es2, err := p2.Wait(ctx)
	if err != nil || es2.ExitCode != 3 {
		t.Fatalf("attach after exit: %+v %v", es2, err)
	}
}

func TestShimSignalsProcessGroupAndIsDetached(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	// The child sleep is in the same group; TERM reaches the shell, which
	// exits 7 from its trap.
	p, err := s.Start(ctx, spec(dir, "b", "/bin/sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done`))
	if err != nil {
		t.Fatal(err)
	}
	pgid, _ := syscall.Getpgid(p.Pid())
	if pgid != p.Pid() {
		t.Errorf("workload pgid %d, want its own group %d", pgid, p.Pid())
	}
	var st shim.Response
	b, _ := os.ReadFile(filepath.Join(dir, "state", "b", shim.PidFile))
	json.Unmarshal(b, &st)
	shimSid, _ := getsid(st.ShimPid)
	mySid, _ := getsid(os.Getpid())
	if shimSid == mySid || shimSid != st.ShimPid {
		t.Errorf("shim session %d (pid %d), daemon session %d: shim must lead its own session", shimSid, st.ShimPid, mySid)
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	es, err := p.Wait(ctx)
	if err != nil || es.ExitCode != 7 {
		t.Fatalf("exit %+v %v", es, err)
	}
	// Nothing of the group is left.
	if err := syscall.Kill(-p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process group %d still exists: %v", p.Pid(), err)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "logs", "b", "0.log"))
	if !strings.Contains(string(log), "got TERM") {
		t.Errorf("log: %s", log)
	}
}

func TestShimKilledBySignalReports128PlusN(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	p, err := s.Start(ctx, spec(dir, "c", "/bin/sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	// Attach a second client while it runs: a restarted daemon does this.
	p2, alive, err := s.Attach(filepath.Join(dir, "state", "c"))
	if err != nil || !alive || p2.Pid() != p.Pid() {
		t.Fatalf("attach: pid %d vs %d, %v", p2.Pid(), p.Pid(), err)
	}
	p2.Signal(syscall.SIGKILL)
	es, err := p.Wait(ctx)
	if err != nil || es.Signal != int(syscall.SIGKILL) || es.ExitCode != 137 {
		t.Fatalf("exit %+v %v", es, err)
	}
}

func TestShimStartError(t *testing.T) {
	s, dir := newStarter(t)
	_, err := s.Start(context.Background(), spec(dir, "d", "/nonexistent/prog"))
	var se *pod.StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "no such file") {
		t.Fatalf("want StartError, got %v", err)
	}
	rec, err := shim.ReadExit(filepath.Join(dir, "state", "d"))
	if err != nil || rec.ExitCode != 128 || rec.Error == "" {
		t.Fatalf("exit file %+v %v", rec, err)
	}
}

func TestWaitCancel(t *testing.T) {
	s, dir := newStarter(t)
	p, err := s.Start(context.Background(), spec(dir, "e", "/bin/sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Signal(syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
}

// attachAll collects an attach session until the exit frame.
func attachAll(t *testing.T, sc pod.StdioConn) (stdout, stderr string, exit *pod.ExitStatus) {
	t.Helper()
	var out, errb []byte
	for {
		o, e, ex, err := sc.Recv()
		if err != nil {
			t.Fatalf("recv: %v (stdout %q, stderr %q)", err, out, errb)
		}
		out, errb = append(out, o...), append(errb, e...)
		if ex != nil {
			return string(out), string(errb), ex
		}
	}
}

func TestShimAttachStdinAndOutput(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	sp := spec(dir, "att", "/bin/sh", "-c", "read x; echo got:$x >&2; echo out; read y; echo second:$y; exit 5")
	sp.Stdin = true
	p, err := s.Start(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	// A watcher without stdin sees the same output.
	watcher, err := p.(pod.Attachable).AttachStdio(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	sc, err := p.(pod.Attachable).AttachStdio(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	// Stdin from a client that did not ask for it is dropped.
	if err := watcher.SendStdin([]byte("ignored\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := sc.SendStdin([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	// Not stdinOnce: closing this client's stdin keeps the container's open.
	if err := sc.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	sc.Close()
	// Wait for the container to have read it, and written what follows,
	// before the next client attaches: it must see only what comes after.
	var seenOut, seenErr []byte
	for !strings.Contains(string(seenErr), "got:hello") || !strings.Contains(string(seenOut), "out\n") {
		o, e, ex, err := watcher.Recv()
		if err != nil || ex != nil {
			t.Fatalf("watcher: %v %+v (stdout so far %q, stderr %q)", err, ex, seenOut, seenErr)
		}
		seenOut, seenErr = append(seenOut, o...), append(seenErr, e...)
	}
	sc2, err := p.(pod.Attachable).AttachStdio(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sc2.Close()
	if err := sc2.SendStdin([]byte("again\n")); err != nil {
		t.Fatal(err)
	}
	out, errOut, ex := attachAll(t, watcher)
	if !strings.HasSuffix(out, "second:again\n") || errOut != "" || ex.ExitCode != 5 {
		t.Fatalf("watcher saw stdout %q stderr %q exit %+v", out, errOut, ex)
	}
	out2, _, ex2 := attachAll(t, sc2)
	if out2 != "second:again\n" || ex2.ExitCode != 5 {
		t.Fatalf("second client saw %q %+v", out2, ex2)
	}
	if es, err := p.Wait(ctx); err != nil || es.ExitCode != 5 {
		t.Fatalf("wait: %+v %v", es, err)
	}
	log, _ := os.ReadFile(sp.LogPath)
	for _, want := range []string{" stderr F got:hello\n", " stdout F out\n", " stdout F second:again\n"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// After the exit an attach is refused.
	if _, err := p.(pod.Attachable).AttachStdio(ctx, false); err == nil {
		t.Fatal("attach after exit succeeded")
	}
}

func TestShimStdinOnceAndNoStdin(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	// stdinOnce: the first stdin client leaving closes the container's
	// stdin, so cat ends.
	sp := spec(dir, "once", "/bin/cat")
	sp.Stdin, sp.StdinOnce = true, true
	p, err := s.Start(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := p.(pod.Attachable).AttachStdio(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	sc.SendStdin([]byte("abc\n"))
	sc.CloseStdin()
	out, _, ex := attachAll(t, sc)
	if out != "abc\n" || ex.ExitCode != 0 {
		t.Fatalf("stdinOnce cat: %q %+v", out, ex)
	}
	// Without stdin: true the container's stdin is /dev/null.
	p2, err := s.Start(ctx, spec(dir, "nostdin", "/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if es, err := p2.Wait(wctx); err != nil || es.ExitCode != 0 {
		t.Fatalf("cat on /dev/null: %+v %v", es, err)
	}
}

// A tty: true container runs on a terminal: its output (echo included) is
// logged as stdout, attached stdin is typed into it, resize reaches it.
func TestShimTTYContainer(t *testing.T) {
	s, dir := newStarter(t)
	ctx := context.Background()
	sp := spec(dir, "tty", "/bin/sh")
	sp.Stdin, sp.StdinOnce, sp.TTY = true, true, true
	p, err := s.Start(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := p.(pod.Attachable).AttachStdio(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := sc.Resize(91, 17); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	sc.SendStdin([]byte("test -t 0 && echo TTY-$((40+2)); stty size\n"))
	var out []byte
	for !strings.Contains(string(out), "17 91\r\n") {
		o, e, ex, err := sc.Recv()
		if err != nil || ex != nil || len(e) > 0 {
			t.Fatalf("recv: %v %+v %q; output %q", err, ex, e, out)
		}
		out = append(out, o...)
	}
	if !strings.Contains(string(out), "TTY-42\r\n") || !strings.Contains(string(out), "echo TTY-$((40+2))") {
		t.Fatalf("not a terminal, or no echo: %q", out)
	}
	// stdinOnce: closing stdin on a terminal types ^D: the shell exits 0.
	sc.CloseStdin()
	if es, err := p.Wait(ctx); err != nil || es.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", es, err)
	}
	log, _ := os.ReadFile(sp.LogPath)
	if !strings.Contains(string(log), " stdout F TTY-42\r\n") && !strings.Contains(string(log), " stdout F TTY-42\r") {
		t.Errorf("log lacks the terminal output:\n%q", log)
	}
}
