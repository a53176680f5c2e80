package dataplane

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A pod's processes hold no capability over its network namespace (the
// host's user namespace owns it), yet its root must bind :80 as a
// container's root does (Debian's nginx as the image's root): AddPod sets
// ip_unprivileged_port_start=0 in the pod's namespace, as containerd and
// Docker do, and nowhere else.
func TestPodUnprivilegedPorts(t *testing.T) {
	f := newFixture(t)
	f.up()
	const knob = "net/ipv4/ip_unprivileged_port_start"
	var pod, host []byte
	in(t, f.a.NetNS, func() (err error) { pod, err = os.ReadFile(filepath.Join("/proc/sys", knob)); return err })
	in(t, f.hostNS, func() (err error) { host, err = os.ReadFile(filepath.Join("/proc/sys", knob)); return err })
	if strings.TrimSpace(string(pod)) != "0" || strings.TrimSpace(string(host)) != "1024" {
		t.Fatalf("%s: pod %q, host %q; want 0 in the pod only", knob, pod, host)
	}
	// What the sysctl is for: an unprivileged uid binds :80 in the pod,
	// and (the same check, where nothing set it) not in the host.
	if err := bindAs(f.a.NetNS, 65534, 80); err != nil {
		t.Errorf("uid 65534 binds :80 in the pod: %v", err)
	}
	if err := bindAs(f.hostNS, 65534, 80); !errors.Is(err, unix.EACCES) {
		t.Errorf("uid 65534 binds :80 in the host namespace: %v, want EACCES", err)
	}
}

// bindAs binds a TCP socket to port on a thread inside nsPath whose uids
// are uid (so it holds no capability). The thread is never unlocked: its
// credentials changed, so it dies with its goroutine.
func bindAs(nsPath string, uid, port int) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		// The raw call changes this thread only (syscall.Setresuid would
		// change every thread of the test binary).
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			done <- e
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(fd)
		done <- unix.Bind(fd, &unix.SockaddrInet4{Port: port})
	}()
	return <-done
}
