package dataplane

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// adoptNetNS pins only namespaces an unprivileged runtime made for itself:
// a network namespace owned by the process's own user namespace, whose
// owner is the runtime's uid; no host namespace and no other user's.
func TestAdoptNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it pins namespaces, as netd does")
	}
	const runtimeUID, otherUID = 64991, 64992
	own := startIn(t, runtimeUID, "unshare", "--user", "--net", "--map-root-user", "sleep", "60")
	plain := startIn(t, runtimeUID, "sleep", "60")
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
	if !sameNS(t, netPath, "/proc/"+strconv.Itoa(own)+"/ns/net") {
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
