package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	"github.com/k3sm-dev/k3sm/internal/testutil/syncbuf"
)

// The test binary doubles as the child: with K3SM_TEST_CHILD set it listens
// on the given unix socket and waits, as a component would.
func TestMain(m *testing.M) {
	switch os.Getenv("K3SM_TEST_CHILD") {
	case "settle":
		// As a hidden role: settle when told, and report the GC target
		// then in force (with this pid) to K3SM_TEST_SETTLED. (A loop of
		// its own: this is the child process, with no test to fail.)
		RunAsChild()
		go func() {
			s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
			for {
				if metrics.Read(s); s[0].Value.Uint64() != 100 {
					os.WriteFile(os.Getenv("K3SM_TEST_SETTLED"), []byte(fmt.Sprintf("%d %d", os.Getpid(), s[0].Value.Uint64())), 0o600)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		fallthrough
	case "serve":
		WatchParent(func() { os.Exit(3) })
		// A killed predecessor leaves its socket file behind, as a real
		// component's does: remove it first, as they do.
		os.Remove(os.Getenv("K3SM_TEST_SOCK"))
		l, err := net.Listen("unix", os.Getenv("K3SM_TEST_SOCK"))
		if err != nil {
			os.Exit(2)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		select {}
	case "supervisor":
		// A supervisor in its own process, so the test can kill -9 it.
		s, err := New(os.Getenv("K3SM_TEST_LOGDIR"), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			os.Exit(2)
		}
		ch, err := s.Start(context.Background(), testChild(os.Getenv("K3SM_TEST_SOCK")))
		if err != nil {
			os.Exit(2)
		}
		os.WriteFile(os.Getenv("K3SM_TEST_PIDFILE"), []byte(strconv.Itoa(ch.Pid())), 0o600)
		select {}
	}
	os.Exit(m.Run())
}

type child struct{ sock string }

func testChild(sock string) child { return child{sock} }

func (c child) Name() string { return "child" }
func (c child) Command() Command {
	return Command{Path: os.Args[0], Env: []string{"K3SM_TEST_CHILD=serve", "K3SM_TEST_SOCK=" + c.sock}}
}
func (c child) Ready(ctx context.Context) error {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", c.sock)
	if err == nil {
		conn.Close()
	}
	return err
}

func newTestSupervisor(t *testing.T) *Supervisor {
	s, err := New(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.Backoff, s.BackoffReset = backoff.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}, time.Minute
	s.StopTimeout = 2 * time.Second
	return s
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	poll.Until(t, 5*time.Second, fmt.Sprintf("process %d to end", pid), func() bool {
		// A zombie still answers kill(0); reap check via /proc where present.
		st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		return !alive(pid) || err == nil && strings.Contains(string(st), ") Z ")
	})
}

func TestRestartAfterKillAndStop(t *testing.T) {
	s := newTestSupervisor(t)
	sock := filepath.Join(t.TempDir(), "c.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := s.Start(ctx, testChild(sock))
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	first := ch.Pid()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the child restarted", func() bool { return ch.Restarts() != 0 && ch.Pid() != first })
	second := ch.Pid()
	s.StopAll()
	waitGone(t, second)
	if ch.Restarts() != 1 {
		t.Fatalf("restarts = %d, want 1", ch.Restarts())
	}
}

func TestStopIsIdempotentAndInterruptsBackoff(t *testing.T) {
	s := newTestSupervisor(t)
	s.Backoff, s.BackoffReset = backoff.Backoff{Initial: time.Hour, Max: time.Hour}, time.Hour
	ch, err := s.Start(context.Background(), testChild(filepath.Join(t.TempDir(), "c.sock")))
	if err != nil {
		t.Fatal(err)
	}
	pid := ch.Pid()
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(t, pid)
	time.Sleep(50 * time.Millisecond) // now sleeping an hour before restart
	done := make(chan struct{})
	go func() { ch.Stop(time.Second); ch.Stop(time.Second); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop waited for the restart backoff")
	}
}

func TestWaitReadyReportsLogTail(t *testing.T) {
	s := newTestSupervisor(t)
	ch, err := s.Start(context.Background(), never{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.StopAll()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = ch.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "boom-marker") {
		t.Fatalf("want error with log tail, got %v", err)
	}
}

type never struct{}

func (never) Name() string { return "never" }
func (never) Command() Command {
	return Command{Path: "/bin/sh", Args: []string{"-c", "echo boom-marker; sleep 30"}}
}
func (never) Ready(context.Context) error { return context.DeadlineExceeded }

// A kill -9 of the supervisor must not leave its children running.
func TestChildrenDieWithSupervisor(t *testing.T) {
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pid")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "K3SM_TEST_CHILD=supervisor", "K3SM_TEST_LOGDIR="+dir,
		"K3SM_TEST_SOCK="+filepath.Join(dir, "c.sock"), "K3SM_TEST_PIDFILE="+pidfile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var childPid int
	poll.Until(t, 10*time.Second, "the supervisor to start its child", func() bool {
		if b, err := os.ReadFile(pidfile); err == nil && len(b) > 0 {
			childPid, _ = strconv.Atoi(string(b))
		}
		return childPid != 0
	})
	cmd.Process.Kill()
	cmd.Wait()
	waitGone(t, childPid)
}

// settledAs says why the settled file does not name pid with the idle GC
// target (37), if it does not.
func settledAs(path string, pid int) error {
	want := fmt.Sprintf("%d 37", pid)
	if b, _ := os.ReadFile(path); string(b) != want {
		return fmt.Errorf("settled file %q, want %q", b, want)
	}
	return nil
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o600)
	if got := Tail(p, 2); got != "c\nd\n" {
		t.Fatalf("Tail = %q", got)
	}
}

type settlingChild struct{ sock, settled string }

func (c settlingChild) Name() string { return "settling" }
func (c settlingChild) Command() Command {
	return Command{Path: os.Args[0], Settle: true, Env: []string{"K3SM_TEST_CHILD=settle", "K3SM_TEST_SOCK=" + c.sock,
		"K3SM_TEST_SETTLED=" + c.settled, IdleGCPercentEnv + "=37", "GOGC=100"}}
}
func (c settlingChild) Ready(ctx context.Context) error { return child{c.sock}.Ready(ctx) }

// A Settle child is told once the supervisor settled and it is ready: not
// before Settle, at Settle, and after a restart once ready again; it then
// lowers its GC target to the idle one.
func TestSettledAfterEachStart(t *testing.T) {
	s := newTestSupervisor(t)
	dir := t.TempDir()
	c := settlingChild{filepath.Join(dir, "c.sock"), filepath.Join(dir, "settled")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := s.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Stop(2 * time.Second)
	waitSettled := func(pid int) {
		t.Helper()
		poll.UntilNil(t, 10*time.Second, fmt.Sprintf("process %d settled", pid), func() error {
			return settledAs(c.settled, pid)
		})
	}
	if err := ch.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if b, err := os.ReadFile(c.settled); err == nil {
		t.Fatalf("settled before the supervisor did: %q", b)
	}
	s.Settle()
	first := ch.Pid()
	waitSettled(first)
	os.Remove(c.settled)
	os.Remove(c.sock)
	syscall.Kill(first, syscall.SIGKILL)
	poll.Until(t, 10*time.Second, "the child restarted", func() bool { return ch.Pid() != first && ch.Pid() != 0 })
	waitSettled(ch.Pid())
}

// eagerChild is a Settle child judged ready as soon as it starts, as the
// node is when the Node its previous process left is still Ready.
type eagerChild struct{ settlingChild }

func (eagerChild) Ready(context.Context) error { return nil }

// Telling a child it settled never kills it, however early it comes: 20
// kill -9 in a row of a child that is ready at once (so it is told at once,
// before its runtime could install a signal handler) give 20 restarts,
// each of a process our SIGKILL ended, and the last one settles.
func TestSettleNeverKillsARestartedChild(t *testing.T) {
	var logs syncbuf.Buffer
	s := newTestSupervisor(t)
	s.Log = slog.New(slog.NewTextHandler(&logs, nil))
	s.Backoff, s.BackoffReset = backoff.Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}, time.Minute
	dir := t.TempDir()
	c := eagerChild{settlingChild{filepath.Join(dir, "c.sock"), filepath.Join(dir, "settled")}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.Settle()
	ch, err := s.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Stop(2 * time.Second)
	const kills = 20
	last := 0
	for i := 0; i <= kills; i++ {
		// Every millisecond: each restart is killed as soon as it is seen.
		poll.Every(t, ctx, 10*time.Second, time.Millisecond, fmt.Sprintf("a restart after kill %d", i), func() error {
			if ch.Pid() == last || ch.Pid() == 0 {
				return fmt.Errorf("not restarted; log:\n%s", logs.String())
			}
			return nil
		})
		last = ch.Pid()
		if i < kills {
			syscall.Kill(last, syscall.SIGKILL)
		}
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "component exited") && !strings.Contains(l, "killed by signal killed") {
			t.Errorf("a child ended other than by our kill: %s", l)
		}
	}
	poll.UntilNil(t, 10*time.Second, "the last process settled", func() error { return settledAs(c.settled, last) })
	if r := ch.Restarts(); r != kills {
		t.Errorf("%d restarts for %d kills; log:\n%s", r, kills, logs.String())
	}
}

func TestRestartMaxDelayEnv(t *testing.T) {
	t.Setenv(RestartMaxDelayEnv, "2s")
	s, err := New(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s.Backoff.Max != 2*time.Second || s.Backoff.Initial != DefaultBackoff.Initial {
		t.Fatalf("backoff %+v, want Max 2s", s.Backoff)
	}
	for _, bad := range []string{"soon", "100ms"} {
		t.Setenv(RestartMaxDelayEnv, bad)
		if _, err := New(t.TempDir(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), RestartMaxDelayEnv) {
			t.Errorf("%s=%s: %v, want an error naming the variable", RestartMaxDelayEnv, bad, err)
		}
	}
}
