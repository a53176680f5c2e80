package dataplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// adoptNetNS pins only namespaces an unprivileged runtime made for itself:
// a network namespace owned by the process's own user namespace, whose
// owner is the runtime's uid; no host namespace and no other user's.
func TestAdoptNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it pins namespaces, as netd does")
	}
	const runtimeUID, otherUID = 64991, 64992
	start := func(uid int, args ...string) int {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		// Until unshare has made its namespaces and exec'd sleep.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"); strings.TrimSpace(string(b)) == "sleep" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return cmd.Process.Pid
	}
	own := start(runtimeUID, "unshare", "--user", "--net", "--map-root-user", "sleep", "60")
	plain := start(runtimeUID, "sleep", "60")
	dir := filepath.Join(t.TempDir(), "netns")
	pin := func(name string) (string, string) {
		p := filepath.Join(dir, name)
		return p, p + ".user"
	}

	netPath, userPath := pin("own")
	if err := adoptNetNS(netPath, userPath, own, runtimeUID); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{netPath, userPath} {
		if ok, err := isNetNS(p); err != nil || !ok {
			t.Errorf("%s not pinned: %v", p, err)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("namespace directory %v %v, want 0711: the runtime enters the files", fi, err)
	}
	var pinned, live unix.Stat_t
	unix.Stat(netPath, &pinned)
	unix.Stat("/proc/"+strconv.Itoa(own)+"/ns/net", &live)
	if pinned.Ino != live.Ino {
		t.Error("the pinned network namespace is not the process's")
	}
	for _, p := range []string{netPath, userPath} {
		if err := removeNetNS(p); err != nil {
			t.Error(err)
		}
	}

	for _, c := range []struct {
		name  string
		pid   int
		owner int
		want  string
	}{
		{"another user's", own, otherUID, "belongs to uid 64991, not the runtime's 64992"},
		{"the host's", plain, runtimeUID, "host's user namespace"},
		{"root's", own, 0, "unprivileged runtime"},
		{"a gone process", 1 << 22, runtimeUID, "no such file"},
	} {
		netPath, userPath := pin(strings.ReplaceAll(c.name, " ", "-"))
		err := adoptNetNS(netPath, userPath, c.pid, c.owner)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		if ok, _ := isNetNS(netPath); ok {
			t.Errorf("%s: pinned anyway", c.name)
		}
	}
}
