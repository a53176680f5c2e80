package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"golang.org/x/sys/unix"
)

// doctor's verdicts on this machine, each compared with what the test
// reads of the kernel itself.
func TestDoctorMachine(t *testing.T) {
	r, _ := doctorJSON(t, t.TempDir())
	for _, c := range r.Checks {
		t.Logf("%s %s: %s", c.Status, c.Name, c.Detail)
		if c.Status != doctor.Pass && c.Fix == "" {
			t.Errorf("%s is %s without a fix", c.Name, c.Status)
		}
	}
	for _, n := range []string{"privilege", "user-namespaces", "overlayfs", "landlock", "cgroups", "cgroup-attach", "nftables", "port 6443", "port 10250", "data-dir", "clock", "certificates"} {
		if doctorCheck(r, n).Status == "" {
			t.Errorf("no %s check", n)
		}
	}
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if c := doctorCheck(r, "landlock"); errno == 0 && !strings.Contains(c.Detail, fmt.Sprintf("ABI v%d", abi)) {
		t.Errorf("landlock: kernel says ABI %d, doctor: %+v", abi, c)
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type != unix.CGROUP2_SUPER_MAGIC {
		if c := doctorCheck(r, "cgroups"); c.Status != doctor.Warn || !strings.Contains(c.Detail, "cgroup v1") {
			t.Errorf("cgroup v1 machine: %+v, want WARN naming cgroup v1", c)
		}
	}
	fs, _ := os.ReadFile("/proc/filesystems")
	if want := map[bool]string{true: doctor.Pass, false: doctor.Warn}[strings.Contains(string(fs), "\toverlay\n")]; doctorCheck(r, "overlayfs").Status != want {
		t.Errorf("overlayfs: %+v, want %s", doctorCheck(r, "overlayfs"), want)
	}
	if c := doctorCheck(r, "privilege"); (os.Geteuid() == 0) != (c.Status == doctor.Pass) {
		t.Errorf("privilege as uid %d: %+v", os.Geteuid(), c)
	}
	if c := doctorCheck(r, "nftables"); os.Geteuid() == 0 && c.Status != doctor.Pass {
		t.Errorf("nftables as root in the test's network namespace: %+v", c)
	}
	if c := doctorCheck(r, "data-dir"); c.Status != doctor.Pass {
		t.Logf("data-dir on this machine's /tmp: %+v", c)
	}
}

// doctor FAILs a data dir that cannot hold a cluster: a nearly full tmpfs
// and a read-only one.
func TestDoctorDataDirFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount tmpfs")
	}
	for _, tc := range []struct {
		name, opts, fix string
		fill            int64
		flags           uintptr
	}{
		{"full", "size=16m", "free space", 15 << 20, 0},
		{"read-only", "size=16m", "read-only", 0, unix.MS_RDONLY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := unix.Mount("tmpfs", dir, "tmpfs", tc.flags, tc.opts); err != nil {
				t.Skipf("mount tmpfs: %v", err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			if tc.fill > 0 {
				f, err := os.Create(filepath.Join(dir, "fill"))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.Write(make([]byte, tc.fill)); err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
			r, code := doctorJSON(t, dir)
			c := doctorCheck(r, "data-dir")
			if code != 1 || c.Status != doctor.Fail || !strings.Contains(c.Fix, tc.fix) {
				t.Fatalf("exit %d, data-dir %+v: want FAIL with a fix naming %q", code, c, tc.fix)
			}
			t.Logf("%s", c.Detail)
			out, _ := runExit(t, "doctor", "--data-dir", dir)
			if !strings.Contains(out, "FAIL  data-dir") || !strings.Contains(out, "fix: ") || !strings.Contains(out, "result: FAIL") {
				t.Errorf("text output:\n%s", out)
			}
		})
	}
}
