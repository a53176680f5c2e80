package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const seccompChildEnv = "K3SM_SANDBOX_SECCOMP_CHILD"

// getppidFilter answers getppid with ENOTSUP and allows everything else.
func getppidFilter() []SockFilter {
	return []SockFilter{
		{Code: 0x20, K: 0}, // ld [nr]
		{Code: 0x15, Jt: 0, Jf: 1, K: unix.SYS_GETPPID},
		{Code: 0x06, K: 0x00050000 | uint32(unix.ENOTSUP)}, // ret ERRNO(ENOTSUP)
		{Code: 0x06, K: 0x7fff0000},                        // ret ALLOW
	}
}

func getppidErr() syscall.Errno {
	_, _, e := unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	return e
}

func noNewPrivs() string {
	f, err := os.Open("/proc/thread-self/status")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "NoNewPrivs:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// TestSeccompChild is the restricted side of the LoadSeccomp tests; it
// does nothing unless one of them started it.
func TestSeccompChild(t *testing.T) {
	mode := os.Getenv(seccompChildEnv)
	if mode == "" {
		t.Skip("helper for the LoadSeccomp tests")
	}
	fail := func(f string, a ...any) {
		os.Stdout.WriteString("FAIL " + fmt.Sprintf(f, a...) + "\n")
		os.Exit(1)
	}
	runtime.LockOSThread()
	switch mode {
	case "thread-only":
		// A thread that exists before the load must stay unfiltered.
		ask, answer := make(chan struct{}), make(chan syscall.Errno)
		go func() {
			runtime.LockOSThread()
			<-ask
			answer <- getppidErr()
		}()
		if err := LoadSeccomp(getppidFilter()); err != nil {
			fail("load: %v", err)
		}
		if e := getppidErr(); e != unix.ENOTSUP {
			fail("getppid on the filtered thread: %v, want ENOTSUP", e)
		}
		ask <- struct{}{}
		if e := <-answer; e != 0 {
			fail("getppid on another thread: %v, want success (the filter must not be synchronised)", e)
		}
	case "no-caps":
		// Without CAP_SYS_ADMIN and without no_new_privs the kernel
		// refuses. Clear this thread's effective set (capabilities are
		// per thread), keeping the permitted one.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			fail("capget: %v", err)
		}
		data[0].Effective, data[1].Effective = 0, 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			fail("capset: %v", err)
		}
		err := LoadSeccomp(getppidFilter())
		if err == nil || !strings.Contains(err.Error(), "no_new_privs") {
			fail("load without privilege: %v, want the EACCES explanation", err)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fail("prctl: %v", err)
		}
		if err := LoadSeccomp(getppidFilter()); err != nil {
			fail("load with no_new_privs: %v", err)
		}
		if e := getppidErr(); e != unix.ENOTSUP {
			fail("getppid: %v, want ENOTSUP", e)
		}
	case "userns":
		if nnp := noNewPrivs(); nnp != "0" {
			fail("NoNewPrivs is %s before the load", nnp)
		}
		if err := LoadSeccomp(getppidFilter()); err != nil {
			fail("load with CAP_SYS_ADMIN in the user namespace: %v", err)
		}
		if e := getppidErr(); e != unix.ENOTSUP {
			fail("getppid: %v, want ENOTSUP", e)
		}
	case "invalid":
		err := LoadSeccomp([]SockFilter{{Code: 0xff}})
		if err == nil || !strings.Contains(err.Error(), "EINVAL") {
			fail("invalid filter: %v, want the EINVAL explanation", err)
		}
	default:
		fail("unknown mode %q", mode)
	}
	os.Stdout.WriteString("CHILD OK\n")
	os.Exit(0)
}

func runSeccompChild(t *testing.T, mode string, attr *syscall.SysProcAttr) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSeccompChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), seccompChildEnv+"="+mode)
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CHILD OK") {
		t.Fatalf("child %s: %v\n%s", mode, err, out)
	}
}

func needSeccompRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the children change credentials and user namespaces")
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil || !strings.Contains(string(b), "Seccomp_filters:") {
		t.Skip("the kernel has no seccomp filter support")
	}
}

func TestLoadSeccompCallingThreadOnly(t *testing.T) {
	needSeccompRoot(t)
	runSeccompChild(t, "thread-only", nil)
}

func TestLoadSeccompNeedsNoNewPrivsWithoutCaps(t *testing.T) {
	needSeccompRoot(t)
	runSeccompChild(t, "no-caps", nil)
}

func TestLoadSeccompWithCapSysAdminInUserNamespace(t *testing.T) {
	needSeccompRoot(t)
	runSeccompChild(t, "userns", &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER,
		// Root maps to root so the child can still execute the test
		// binary in its 0700 build directory; its capabilities hold only
		// in the new namespace.
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	})
}

func TestLoadSeccompInvalidFilter(t *testing.T) {
	needSeccompRoot(t)
	runSeccompChild(t, "invalid", nil)
}

// These return before any system call, so they run in the test process.
func TestLoadSeccompRefusesEmptyAndOversized(t *testing.T) {
	if err := LoadSeccomp(nil); err == nil || !strings.Contains(err.Error(), "unconfined") {
		t.Errorf("LoadSeccomp(nil) = %v, want the empty-filter error", err)
	}
	if err := LoadSeccomp(make([]SockFilter, 4097)); err == nil || !strings.Contains(err.Error(), "4096") {
		t.Errorf("LoadSeccomp(4097 instructions) = %v, want the limit error", err)
	}
}
