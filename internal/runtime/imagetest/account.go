package imagetest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// RootlessAccount makes the system account name with uid (and a group of
// the same number) and, when sub is not 0, a subordinate range of 65536
// ids from sub in /etc/subuid and /etc/subgid, all undone when the test
// ends: an unprivileged user a test runs k3sm as (the rootless sandbox).
// It needs root, and skips without useradd, newuidmap or newgidmap.
func RootlessAccount(t testing.TB, name string, uid int, sub uint32) {
	t.Helper()
	for _, tool := range []string{"useradd", "userdel", "newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Debian: passwd, uidmap)", tool)
		}
	}
	exec.Command("userdel", name).Run() // left by a run that was killed
	// newuidmap wants the caller to have a name, and a group of its own
	// number keeps the test's ids simple.
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
		"--key", "SYS_GID_MIN="+strconv.Itoa(uid), "--key", "SYS_GID_MAX="+strconv.Itoa(uid), "--uid", strconv.Itoa(uid), name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	if sub == 0 {
		return
	}
	line := fmt.Sprintf("%s:%d:65536", name, sub)
	for _, file := range []string{"/etc/subuid", "/etc/subgid"} {
		old, err := os.ReadFile(file)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		body := string(old)
		if body != "" && !strings.HasSuffix(body, "\n") {
			body += "\n"
		}
		if err := os.WriteFile(file, []byte(body+line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Only this line goes: what others added meanwhile stays.
		t.Cleanup(func() {
			cur, err := os.ReadFile(file)
			if err != nil {
				return
			}
			var keep []string
			for _, l := range strings.SplitAfter(string(cur), "\n") {
				if strings.TrimSpace(l) != line && l != "" {
					keep = append(keep, l)
				}
			}
			os.WriteFile(file, []byte(strings.Join(keep, "")), 0o644)
		})
	}
}

// CopyExecutables copies each file of from (a path) into dir, mode 0755,
// under its base name: binaries an unprivileged user can run where the
// originals are in a directory only root enters.
func CopyExecutables(t testing.TB, dir string, from ...string) {
	t.Helper()
	for _, src := range from {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		name := src[strings.LastIndexByte(src, '/')+1:]
		if err := os.WriteFile(dir+"/"+name, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}
