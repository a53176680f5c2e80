package dataplane

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// startIn starts argv (as uid when uid > 0) and waits until it runs sleep.
func startIn(t *testing.T, uid int, argv ...string) int {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if uid > 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	poll.Until(t, 10*time.Second, fmt.Sprintf("%v to run sleep", argv), func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
		return strings.TrimSpace(string(b)) == "sleep"
	})
	return cmd.Process.Pid
}

// sameNS reports whether two namespace files are one namespace.
func sameNS(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// A pin that vanished with the mount namespace netd made it in (netd
// under `ip netns exec` or PrivateMounts=, restarted) while the pod's
// process still runs: AddPod pins the pod's own namespace again, with its
// veth, address and listening sockets, instead of giving the address to a
// new, empty namespace.
func TestRecoverLostPin(t *testing.T) {
	f := newFixture(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("needs nsenter (util-linux)")
	}
	f.up()
	sa := serve(t, f.a.NetNS, 8080)
	pid := startIn(t, 0, "nsenter", "--net="+f.a.NetNS, "sleep", "60")
	live := "/proc/" + strconv.Itoa(pid) + "/ns/net"
	if err := unix.Unmount(f.a.NetNS, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := f.dp.AddPod(testNode, f.a); err != nil {
		t.Fatal(err)
	}
	if ok, _ := isNetNS(f.a.NetNS); !ok {
		t.Fatal("AddPod left the pin unmounted")
	}
	if !sameNS(t, f.a.NetNS, live) {
		t.Fatal("AddPod pinned a new namespace: the pod's process is cut off from its address")
	}
	if src := sa.reach(t, f.b.NetNS, at(f.a.IP)); src != f.b.IP {
		t.Errorf("B → A's listener in its recovered namespace arrived from %v", src)
	}
	// Again: nothing to recover, nothing changes.
	if err := f.dp.AddPod(testNode, f.a); err != nil || !sameNS(t, f.a.NetNS, live) {
		t.Fatalf("AddPod again: %v (same namespace: %v)", err, sameNS(t, f.a.NetNS, live))
	}
}

// The same for a pod of a runtime that is not root: both its network
// namespace and the runtime's user namespace that owns it are pinned
// again, and only when that user namespace is the runtime's.
func TestRecoverLostUserNSPin(t *testing.T) {
	f := newFixture(t)
	const runtimeUID, otherUID = 64993, 64994
	f.dp.EnsureNode(testNode)
	holder := startIn(t, runtimeUID, "unshare", "--user", "--net", "--map-root-user", "sleep", "60")
	p := f.a
	p.UserNS, p.Owner, p.FromPid = p.NetNS+".user", runtimeUID, holder
	if err := f.dp.AddPod(testNode, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeNetNS(p.UserNS) })
	for _, pin := range []string{p.NetNS, p.UserNS} {
		if err := unix.Unmount(pin, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	p.FromPid = 0 // a restarted netd knows no process
	other := p
	other.Owner = otherUID
	if err := f.dp.AddPod(testNode, other); err == nil || !strings.Contains(err.Error(), "not the runtime's") {
		t.Fatalf("recovering for another uid: %v, want a refusal", err)
	}
	if ok, _ := isNetNS(p.NetNS); ok {
		t.Fatal("pinned for another uid")
	}
	if err := f.dp.AddPod(testNode, p); err != nil {
		t.Fatal(err)
	}
	proc := "/proc/" + strconv.Itoa(holder) + "/ns/"
	if !sameNS(t, p.NetNS, proc+"net") || !sameNS(t, p.UserNS, proc+"user") {
		t.Fatal("the recovered pins are not the pod's namespaces")
	}
	if ip := f.link(p.NetNS, "eth0"); ip == nil {
		t.Fatal("no eth0")
	}
}
