package doctor

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/limits"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

func want(t *testing.T, c Check, status, detail string) {
	t.Helper()
	if c.Status != status || !strings.Contains(c.Detail, detail) {
		t.Errorf("%s: got %s %q, want %s containing %q", c.Name, c.Status, c.Detail, status, detail)
	}
	if c.Status != Pass && c.Fix == "" {
		t.Errorf("%s: %s without a fix", c.Name, c.Status)
	}
}

func TestPrivilege(t *testing.T) {
	want(t, privilege(0), Pass, "own network namespace")
	want(t, privilege(1000), Warn, "falls back to host")
}

func TestPortVerdict(t *testing.T) {
	p := Port{"https-listen-port", "0.0.0.0", 6443}
	want(t, portVerdict(p, nil), Pass, "0.0.0.0:6443 is free")
	c := portVerdict(p, &os.SyscallError{Syscall: "bind", Err: syscall.EADDRINUSE})
	want(t, c, Fail, "address already in use")
	if !strings.Contains(c.Fix, "--https-listen-port") {
		t.Errorf("fix does not name the flag: %q", c.Fix)
	}
}

func TestDiskVerdict(t *testing.T) {
	th, err := diskpolicy.ParseEvictionHard(diskpolicy.Default().EvictionHard)
	if err != nil {
		t.Fatal(err)
	}
	big := DiskUsage{Total: 100 << 30, Avail: 50 << 30, Inodes: 1000, InodesFree: 900}
	want(t, diskVerdict("/d", "/d", nil, big, th), Pass, "writable, 50.0 GiB free")
	want(t, diskVerdict("/d/x", "/d", nil, big, th), Pass, "does not exist yet; checked /d")
	low := big
	low.Avail = 12 << 30 // 12 %: below imagefs.available<15%
	want(t, diskVerdict("/d", "/d", nil, low, th), Warn, "imagefs.available (<15%)")
	inodes := big
	inodes.InodesFree = 10
	want(t, diskVerdict("/d", "/d", nil, inodes, th), Warn, "nodefs.inodesFree")
	tiny := DiskUsage{Total: 16 << 20, Avail: 1 << 20}
	want(t, diskVerdict("/d", "/d", nil, tiny, th), Fail, "only 1.0 MiB free")
	c := diskVerdict("/d", "/d", &os.PathError{Op: "open", Path: "/d/x", Err: syscall.EROFS}, big, th)
	want(t, c, Fail, "read-only file system")
	if !strings.Contains(c.Fix, "read-only") {
		t.Errorf("fix %q", c.Fix)
	}
	c = diskVerdict("/d", "/d", syscall.EACCES, big, th)
	want(t, c, Fail, "permission denied")
	if !strings.Contains(c.Fix, "--data-dir") {
		t.Errorf("fix %q", c.Fix)
	}
}

func TestClockVerdict(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	want(t, clockVerdict(now, true, true), Pass, "synchronized")
	want(t, clockVerdict(now, false, true), Warn, "not synchronized")
	want(t, clockVerdict(now, false, false), Pass, "cannot be read")
	want(t, clockVerdict(time.Unix(0, 0), true, true), Fail, "1970")
}

func TestCertVerdict(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ok := certs.Cert{Name: "server-ca", CA: true, Status: "ok", NotAfter: now.AddDate(9, 0, 0)}
	leaf := certs.Cert{Name: "client-admin", Status: "ok", NotAfter: now.AddDate(0, 0, 200)}
	want(t, certVerdict([]certs.Cert{ok, leaf}, nil, now), Pass, "first to expire is client-admin on 2027-06-19 (200 days)")
	leaf.Status = "renew"
	want(t, certVerdict([]certs.Cert{ok, leaf}, nil, now), Warn, "client-admin")
	ok.Status = "rotate-ca"
	want(t, certVerdict([]certs.Cert{ok, leaf}, nil, now), Warn, "CAs expire within a year: server-ca")
	leaf.Status = "expired"
	want(t, certVerdict([]certs.Cert{ok, leaf}, nil, now), Fail, "expired: client-admin")
	want(t, certVerdict(nil, errors.New("bad pem"), now), Fail, "bad pem")
}

func TestUsernsVerdict(t *testing.T) {
	want(t, usernsVerdict(1000, "", "", 1000), Pass, "available")
	want(t, usernsVerdict(0, "", "", 1000), Fail, "max_user_namespaces is 0")
	want(t, usernsVerdict(0, "", "", 0), Warn, "fine as root")
	want(t, usernsVerdict(1000, "0", "", 1000), Fail, "unprivileged_userns_clone is 0")
	want(t, usernsVerdict(1000, "1", "1", 1000), Fail, "AppArmor")
}

func TestOverlayVerdict(t *testing.T) {
	want(t, overlayVerdict("nodev\tsysfs\n\text4\nnodev\toverlay\n"), Pass, "overlay")
	want(t, overlayVerdict("nodev\tsysfs\n\text4\n"), Warn, "not in /proc/filesystems")
}

func TestLandlockVerdict(t *testing.T) {
	want(t, landlockVerdict(7, nil), Pass, "Landlock ABI v7: pods' file access is restricted")
	want(t, landlockVerdict(6, nil), Pass, "Landlock ABI v6: pods' file access is restricted")
	want(t, landlockVerdict(4, nil), Pass, "ABI v4: pods' file access is restricted (device ioctls are confined from ABI 5)")
	want(t, landlockVerdict(2, nil), Pass, "ABI v2: pods' file access is restricted (truncate")
	want(t, landlockVerdict(1, nil), Warn, "EXDEV")
	for _, err := range []error{syscall.ENOSYS, syscall.EOPNOTSUPP, syscall.EINVAL} {
		c := landlockVerdict(0, err)
		want(t, c, Warn, "namespaces are the only boundary")
		if !strings.Contains(c.Fix, "CONFIG_SECURITY_LANDLOCK") || !strings.Contains(c.Fix, "lsm=") {
			t.Errorf("%v: fix %q names neither CONFIG_SECURITY_LANDLOCK nor lsm=", err, c.Fix)
		}
	}
	want(t, landlockVerdict(0, syscall.ENOSYS), Warn, "no Landlock (ENOSYS)")
	want(t, landlockVerdict(0, syscall.EOPNOTSUPP), Warn, "not enabled (EOPNOTSUPP)")
}

// On this machine the check reports the ABI the sandbox applies.
func TestLandlockCheckMatchesSandbox(t *testing.T) {
	var got *Check
	for _, c := range kernelChecks(t.TempDir(), t.TempDir()) {
		if c.Name == "landlock" {
			got = &c
		}
	}
	if runtime.GOOS != "linux" {
		if got != nil {
			t.Errorf("landlock checked on %s", runtime.GOOS)
		}
		return
	}
	if got == nil {
		t.Fatal("no landlock check")
	}
	switch abi := sandbox.LandlockABI(); abi {
	case 0:
		want(t, *got, Warn, "only boundary")
	case 1:
		want(t, *got, Warn, "Landlock ABI v1:")
	default:
		want(t, *got, Pass, fmt.Sprintf("Landlock ABI v%d:", abi))
	}
}

func TestCgroupVerdict(t *testing.T) {
	const sock = "/d/run/runtime.sock"
	all := []string{cgroups.CPU, cgroups.Memory, cgroups.Pids}
	netns := cgroups.Support{Cause: cgroups.CauseNotMounted, Reason: "no cgroup hierarchy is mounted in the runtime's mount namespace (/sys/fs/cgroup is empty)", Fix: "start it without `ip netns exec`"}
	c := cgroupVerdict(limits.Report{Support: netns, OS: "linux", FromRuntime: true}, sock, 0)
	want(t, c, Fail, "the running runtime reports no cgroups: no cgroup hierarchy is mounted")
	want(t, c, Fail, "pods' CPU and memory limits are not enforced by the kernel")
	if c.Fix != netns.Fix {
		t.Errorf("fix %q, want the detection's", c.Fix)
	}
	want(t, cgroupVerdict(limits.Report{Support: netns, OS: "linux"}, sock, 0), Fail, "no runtime runs at "+sock)
	rootless := cgroups.Support{Cause: cgroups.CauseNotPermitted, Reason: "cgroup v2: permission denied", Fix: "Delegate=yes"}
	want(t, cgroupVerdict(limits.Report{Support: rootless, OS: "linux"}, sock, 1000), Warn, "CPU and memory limits are not enforced")
	noCPU := cgroups.Support{Version: cgroups.V1, Enforced: []string{cgroups.Memory, cgroups.Pids}, Cause: cgroups.CauseNoController, Reason: "not available: cpu: no v1 hierarchy mounted", Fix: "mount it"}
	want(t, cgroupVerdict(limits.Report{Support: noCPU, OS: "linux", FromRuntime: true}, sock, 0), Fail, "pods' CPU limits are not enforced")
	noPids := cgroups.Support{Version: cgroups.V2, Enforced: []string{cgroups.CPU, cgroups.Memory}, Cause: cgroups.CauseNoController, Reason: "not available: pids", Fix: "enable it"}
	want(t, cgroupVerdict(limits.Report{Support: noPids, OS: "linux", FromRuntime: true}, sock, 0), Warn, "pids limit (4096) is not enforced")
	want(t, cgroupVerdict(limits.Report{Support: cgroups.Support{Version: cgroups.V1, Enforced: all}, OS: "linux"}, sock, 0), Warn, "cgroup v1: cpu, memory, pids limits enforced")
	want(t, cgroupVerdict(limits.Report{Support: cgroups.Support{Version: cgroups.V2, Enforced: all}, OS: "linux", FromRuntime: true}, sock, 0), Pass, "the running runtime reports cgroup v2: cpu, memory, pids limits enforced")
	// A runtime doctor cannot ask: what doctor finds itself, never a PASS.
	c = cgroupVerdict(limits.Report{Support: cgroups.Support{Version: cgroups.V2, Enforced: all}, OS: "linux", AskErr: syscall.EACCES}, sock, 1000)
	want(t, c, Warn, "could not be asked (permission denied); doctor, as uid 1000, finds cgroup v2")
	if !strings.Contains(c.Fix, "sudo k3sm doctor") {
		t.Errorf("fix %q", c.Fix)
	}
	want(t, attachVerdict(cgroups.AttachMode{Mount: "/sys/fs/cgroup", Options: []string{"nsdelegate", "favordynmods"}, Favored: true}, nil, 0), Pass, "favordynmods is set")
	want(t, attachVerdict(cgroups.AttachMode{Mount: "/sys/fs/cgroup/unified", Options: []string{"nsdelegate"}}, nil, 0), Warn, "sets it when its runtime starts")
	want(t, attachVerdict(cgroups.AttachMode{Mount: "/sys/fs/cgroup"}, nil, 1000), Warn, "not root cannot set it")
	want(t, attachVerdict(cgroups.AttachMode{}, nil, 0), Warn, "no cgroup2 hierarchy")
}

func TestNftVerdict(t *testing.T) {
	want(t, nftVerdict([]string{"filter"}, nil, 0), Pass, "1 tables")
	want(t, nftVerdict([]string{"filter", "k3sm-policy", "k3sm-guard"}, nil, 0), Pass, "k3sm-policy, k3sm-guard")
	want(t, nftVerdict(nil, syscall.EPERM, 1000), Warn, "only k3sm-netd")
	want(t, nftVerdict(nil, syscall.EPROTONOSUPPORT, 0), Fail, "cannot program")
}

// The macOS check, tested here: it is plain logic on statfs's type name.
func TestAPFSVerdict(t *testing.T) {
	want(t, apfsVerdict("/d", "apfs", nil), Pass, "cloned copy-on-write")
	want(t, apfsVerdict("/d", "hfs", nil), Warn, "on hfs, not APFS")
	want(t, apfsVerdict("/d", "", syscall.ENOENT), Warn, "cannot read")
}

// Run on this machine: every check is there and the result is the worst.
func TestRunResultIsWorst(t *testing.T) {
	r := Run(Options{DataDir: t.TempDir(), Ports: []Port{}})
	worst := Pass
	for _, c := range r.Checks {
		if c.Status == Fail {
			worst = Fail
		} else if c.Status == Warn && worst == Pass {
			worst = Warn
		}
	}
	if r.Result != worst || len(r.Checks) < 4 {
		t.Fatalf("result %s, worst %s, %d checks", r.Result, worst, len(r.Checks))
	}
}

func TestPodIDsVerdict(t *testing.T) {
	want(t, podIDsVerdict(0, ""), Pass, "65536 host ids of its own")
	want(t, podIDsVerdict(1000, ""), Pass, "ids 1-65535 come from the subordinate range")
	c := podIDsVerdict(1000, "k3sm (uid 1000) has no subordinate range of 65536 ids in /etc/subuid and /etc/subgid, so a pod's user namespace has only its root (id 0, which is k3sm); to fix: give k3sm a subordinate range")
	want(t, c, Warn, "has no subordinate range")
	if c.Fix != "give k3sm a subordinate range" || strings.Contains(c.Detail, "to fix") {
		t.Errorf("fix %q, detail %q", c.Fix, c.Detail)
	}
}

func TestDatastoreVerdict(t *testing.T) {
	l := datadir.New("/d")
	want(t, datastoreVerdict(l, datastore.Record{}, false, nil), Pass, "no cluster at /d yet")
	want(t, datastoreVerdict(l, datastore.Record{}, false, errors.New("bad json")), Fail, "bad json")
	sqlite := datastore.Record{}
	want(t, datastoreVerdict(l, sqlite, true, nil), Pass, "embedded SQLite /d/server/db/state.db")
	want(t, datastoreVerdict(l, sqlite, true, os.ErrNotExist), Fail, "file does not exist")
	pg := datastore.Record{Config: datastore.Config{Endpoint: "postgres://k3s:pw@127.0.0.1:5432/k"}}
	want(t, datastoreVerdict(l, pg, true, nil), Pass, "postgres://k3s:xxxxx@127.0.0.1:5432/k answers")
	c := datastoreVerdict(l, pg, true, errors.New("connection refused"))
	want(t, c, Fail, "does not answer: connection refused")
	if !strings.Contains(c.Fix, "--datastore-endpoint") {
		t.Errorf("fix %q does not name the flag", c.Fix)
	}
}
