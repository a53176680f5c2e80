package sandbox_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox/seatbelt"
)

func TestWrapArgv(t *testing.T) {
	argv := []string{"/bin/echo", "-n", "x"}
	if got := sandbox.WrapArgv(nil, argv); !slices.Equal(got, argv) {
		t.Errorf("no spec: %q", got)
	}
	if got := sandbox.WrapArgv(&sandbox.Spec{}, argv); !slices.Equal(got, argv) {
		t.Errorf("no profile: %q", got)
	}
	got := sandbox.WrapArgv(&sandbox.Spec{Seatbelt: "(version 1)"}, argv)
	want := []string{"/usr/bin/sandbox-exec", "-p", "(version 1)", "--", "/bin/echo", "-n", "x"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// layout makes a data dir with two pods and k3sm's own files, as the
// runtime lays them out, under a canonical temp path (Seatbelt matches
// resolved paths: /private/var/folders, not /var/folders).
func layout(t *testing.T) (p seatbelt.Pod, other string) {
	t.Helper()
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tmp, "data")
	p = seatbelt.Pod{
		DataDir:  data,
		PodDir:   filepath.Join(data, "pods", "uid-a"),
		Root:     filepath.Join(data, "pods", "uid-a", "roots", "web"),
		Writable: []string{filepath.Join(data, "pods", "uid-a", "volumes", "scratch")},
		ReadOnly: []string{filepath.Join(data, "pods", "uid-a", "volumes", "config")},
	}
	other = filepath.Join(data, "pods", "uid-b", "roots", "web")
	for _, d := range []string{p.Root, p.Writable[0], p.ReadOnly[0], other, filepath.Join(data, "run"), filepath.Join(data, "logs", "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(data, "admin.kubeconfig"), filepath.Join(other, "secret"), filepath.Join(p.ReadOnly[0], "app.conf"), filepath.Join(p.PodDir, "pod.json")} {
		if err := os.WriteFile(f, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return p, other
}

// sh runs script under p's profile through WrapArgv.
func sh(t *testing.T, p seatbelt.Pod, script string) (string, bool) {
	t.Helper()
	prof, err := seatbelt.Profile(p)
	if err != nil {
		t.Fatal(err)
	}
	argv := sandbox.WrapArgv(&sandbox.Spec{Seatbelt: prof}, []string{"/bin/sh", "-c", script})
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.Root
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// TestSeatbeltBoundary runs real processes under generated profiles (macOS
// only): what a pod must reach works, what it must not is refused.
func TestSeatbeltBoundary(t *testing.T) {
	if _, err := os.Stat(sandbox.SandboxExec); err != nil {
		t.Skipf("no %s: %v", sandbox.SandboxExec, err)
	}
	p, other := layout(t)
	if out, ok := sh(t, p, "true"); !ok {
		t.Fatalf("a plain command fails under the profile: %s", out)
	}
	home, _ := os.UserHomeDir()
	allowed := []string{
		"echo hi > " + p.Root + "/f && cat " + p.Root + "/f",
		"echo hi > " + p.Writable[0] + "/f",
		"cat " + p.ReadOnly[0] + "/app.conf",
		"ls /usr/lib >/dev/null && /usr/bin/id -u >/dev/null",
	}
	denied := []string{
		"cat " + p.DataDir + "/admin.kubeconfig",
		"cat " + p.PodDir + "/pod.json",
		"cat " + other + "/secret",
		"ls " + p.DataDir + "/logs/pods",
		"ls /Users",
		"ls /System/Volumes/Data/Users",
		"echo x > /private/etc/k3sm-test",
		"echo x > /usr/k3sm-test",
		"echo x > " + p.DataDir + "/run/x",
		"echo x > " + p.ReadOnly[0] + "/app.conf",
		"echo x > /private/tmp/k3sm-test-" + filepath.Base(p.DataDir),
	}
	if home != "" && strings.HasPrefix(home, "/Users/") {
		denied = append(denied, "ls "+home)
	}
	for _, s := range allowed {
		if out, ok := sh(t, p, s); !ok {
			t.Errorf("refused, want allowed: %s: %s", s, out)
		}
	}
	for _, s := range denied {
		if out, ok := sh(t, p, s); ok {
			t.Errorf("allowed, want refused: %s: %s", s, out)
		}
	}

	ro := p
	ro.ReadOnlyRoot = true
	if out, ok := sh(t, ro, "echo x > "+p.Root+"/g"); ok {
		t.Errorf("readOnlyRootFilesystem: the root was written: %s", out)
	}

	// A loopback listener of the host: refused without the opt-in, reached with it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	connect := "/usr/bin/nc -z -G 2 127.0.0.1 " + strconv.Itoa(port)
	if out, ok := sh(t, p, connect); ok {
		t.Errorf("connected to the host's loopback without %s: %s", seatbelt.NetworkAnnotation, out)
	}
	netPod := p
	netPod.Network = true
	if out, ok := sh(t, netPod, connect); !ok {
		t.Errorf("opted-in pod cannot connect: %s", out)
	}
}
