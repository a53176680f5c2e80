//go:build linux

package shimclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/shim"
)

func needNamespaces(t *testing.T) {
	t.Helper()
	if !mounts.Namespaced() {
		t.Skip("mount namespaces need root or usable unprivileged user namespaces")
	}
}

func TestShimMountsVolumesInItsOwnNamespace(t *testing.T) {
	needNamespaces(t)
	s, dir := newStarter(t)
	ctx := context.Background()
	vol := filepath.Join(dir, "vol")
	os.MkdirAll(vol, 0o755)
	os.WriteFile(filepath.Join(vol, "file"), []byte("from the volume"), 0o644)
	conf := filepath.Join(dir, "conf")
	os.WriteFile(conf, []byte("config line"), 0o644)
	// Right under / (the shim pivots into a new root) and under the test's
	// directory (mirrored): neither exists on the host.
	top := fmt.Sprintf("/k3sm-shimtest-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() { os.RemoveAll(top) })
	mirrored := filepath.Join(dir, "m", "etc", "app.conf")
	os.Mkdir(filepath.Join(dir, "m"), 0o755)
	sp := spec(dir, "mnt", "/bin/sh", "-c", "cat "+top+"/target/file; echo; cat "+mirrored+"; echo; exec sleep 100")
	sp.Mounts = []mounts.Mount{{Source: vol, Target: top + "/target"}, {Source: conf, Target: mirrored, ReadOnly: true}}
	p, err := s.Start(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Signal(syscall.SIGKILL)
	for _, path := range []string{top, filepath.Join(dir, "m", "etc")} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists on the host: %v", path, err)
		}
	}
	// The workload is in the shim's namespace, not ours.
	ours, _ := os.Readlink("/proc/self/ns/mnt")
	if theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", p.Pid())); theirs == ours || theirs == "" {
		t.Errorf("workload mount namespace %q, daemon's %q", theirs, ours)
	}
	// Commands entered into it see the volume, in the working directory
	// asked for.
	argv, err := mounts.EnterArgv(p.Pid(), top+"/target", []string{"/bin/cat", "file"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil || string(out) != "from the volume" {
		t.Errorf("%q: %q %v", argv, out, err)
	}
	// The shim's own socket and log still work after its pivot_root: the
	// log reopens by path.
	logPath := filepath.Join(dir, "logs", "mnt", "0.log")
	if _, err := p.(*process).call(ctx, shim.Request{Op: "reopen"}); err != nil {
		t.Fatalf("reopen the log inside the namespace: %v", err)
	}
	// Not poll: the checks below report (Errorf) which line is missing.
	deadline := time.Now().Add(5 * time.Second)
	var log []byte
	for time.Now().Before(deadline) {
		log, _ = os.ReadFile(logPath)
		if strings.Contains(string(log), "config line") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{" stdout F from the volume\n", " stdout F config line\n"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if es, err := p.Wait(ctx); err != nil || es.Signal != int(syscall.SIGKILL) {
		t.Fatalf("exit %+v %v", es, err)
	}
	// exit.json was written through the new root, to the host's file.
	if es, err := shim.ReadExit(sp.StateDir); err != nil || es.Signal != int(syscall.SIGKILL) {
		t.Errorf("exit file: %+v %v", es, err)
	}
}

func TestShimWithoutMountsSharesTheDaemonsNamespace(t *testing.T) {
	s, dir := newStarter(t)
	p, err := s.Start(context.Background(), spec(dir, "nomnt", "/bin/sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Wait(context.Background())
	defer p.Signal(syscall.SIGKILL)
	ours, _ := os.Readlink("/proc/self/ns/mnt")
	if theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", p.Pid())); theirs != ours {
		t.Errorf("workload without mounts in mount namespace %q, daemon's %q", theirs, ours)
	}
}

func TestShimBadMountIsStartError(t *testing.T) {
	needNamespaces(t)
	s, dir := newStarter(t)
	sp := spec(dir, "bad", "/bin/true")
	sp.Mounts = []mounts.Mount{{Source: filepath.Join(dir, "no-such-volume"), Target: "/k3sm-shimtest-bad/target"}}
	_, err := s.Start(context.Background(), sp)
	var se *pod.StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "/k3sm-shimtest-bad/target") || !strings.Contains(se.Msg, "no such file") {
		t.Fatalf("bad mount: %T %v", err, err)
	}
	// Recorded for a daemon that was not listening, too.
	if es, err := shim.ReadExit(sp.StateDir); err != nil || es.ExitCode != 128 || es.Error != se.Msg {
		t.Errorf("exit file: %+v %v", es, err)
	}
	if log, _ := os.ReadFile(sp.LogPath); !strings.Contains(string(log), "/k3sm-shimtest-bad/target") {
		t.Errorf("log: %s", log)
	}
}

func TestShimMountsWithTTY(t *testing.T) {
	needNamespaces(t)
	s, dir := newStarter(t)
	vol := filepath.Join(dir, "vol")
	os.MkdirAll(vol, 0o755)
	os.WriteFile(filepath.Join(vol, "file"), []byte("tty volume"), 0o644)
	top := fmt.Sprintf("/k3sm-shimtest-tty-%d", os.Getpid())
	sp := spec(dir, "ttymnt", "/bin/sh", "-c", "cat "+top+"/v/file; echo; tty")
	sp.TTY = true
	sp.Mounts = []mounts.Mount{{Source: vol, Target: top + "/v"}}
	p, err := s.Start(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	if es, err := p.Wait(context.Background()); err != nil || es.ExitCode != 0 {
		t.Fatalf("exit %+v %v", es, err)
	}
	log, _ := os.ReadFile(sp.LogPath)
	if !strings.Contains(string(log), "tty volume") || !strings.Contains(string(log), "/dev/pts/") {
		t.Errorf("log:\n%s", log)
	}
	if _, err := os.Lstat(top); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists on the host: %v", top, err)
	}
}
