package podnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newNetNS makes a network namespace bound at a file, with lo up, as netd
// would (without the veth). Needs root.
func newNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	path := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(path, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in its namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Skipf("cannot create a network namespace here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
	if out, err := exec.Command("nsenter", "--net="+path, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	return path
}

// listenIn listens on 127.0.0.1 inside the namespace.
func listenIn(t *testing.T, ns string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := onThreadIn(ns, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("inside\n"))
			c.Close()
		}
	}()
	return ln
}

func TestDialReachesOnlyTheNamespace(t *testing.T) {
	ns := newNetNS(t)
	ln := listenIn(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, ns, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial inside the namespace: %v", err)
	}
	b := make([]byte, 7)
	if _, err := c.Read(b); err != nil || string(b) != "inside\n" {
		t.Fatalf("read %q, %v", b, err)
	}
	c.Close()
	// The same address from the host's network is not the pod's port.
	if c, err := Dial(ctx, "", "tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("the pod's port %s answered on the host's loopback", ln.Addr())
	}
	// And a host listener is not reachable from inside.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if c, err := Dial(ctx, ns, "tcp", host.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("the host's %s answered inside the pod's namespace", host.Addr())
	}
}

func TestStartInRunsTheChildInTheNamespace(t *testing.T) {
	ns := newNetNS(t)
	// The namespace the child must be in is the one bound at ns. (Not
	// "other than /proc/self's": /proc/self is the main thread, which
	// newNetNS's locked goroutine may have been, leaving it in ns.)
	var st unix.Stat_t
	if err := unix.Stat(ns, &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if own == want {
		t.Fatalf("the test's own thread is already in %s", want)
	}
	cmd := exec.Command("readlink", "/proc/self/ns/net")
	var out []byte
	done := make(chan error, 1)
	pr, pw, _ := os.Pipe()
	cmd.Stdout = pw
	if err := StartIn(ns, cmd.Start); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	go func() { out = make([]byte, 64); n, _ := pr.Read(out); out = out[:n]; done <- cmd.Wait() }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := string(out); got != want+"\n" {
		t.Fatalf("child's network namespace %q, want the pod's %q (the caller's is %q)", got, want, own)
	}
	// The calling thread never left its own namespace.
	if now, _ := os.Readlink("/proc/thread-self/ns/net"); now != own {
		t.Fatalf("caller left in %s, was %s", now, own)
	}
}
