package sandbox

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestImagePolicy(t *testing.T) {
	got := ImagePolicy([]string{"/data", "/cache/", "/data"}, false)
	want := &Landlock{ReadExec: []string{"/"}, ReadWrite: []string{"/", "/dev", "/proc", "/data", "/cache"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("writable root: got %+v, want %+v", got, want)
	}
	got = ImagePolicy([]string{"/data"}, true)
	want = &Landlock{ReadExec: []string{"/"}, ReadWrite: []string{"/dev", "/proc", "/data"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read-only root: got %+v, want %+v", got, want)
	}
	if slices.Contains(got.ReadWrite, "/tmp") {
		t.Error("a read-only root keeps /tmp read-only")
	}
}

func TestNativePolicy(t *testing.T) {
	etc := []string{"/etc/passwd", "/etc/ssl"}
	pod := "/var/lib/k3sm/pods/uid-1"
	l := nativePolicy(etc, pod, []string{pod + "/roots/app", "/srv/vol"}, []string{pod + "/volumes/cfg"})
	for _, p := range []string{"/usr", "/bin", "/lib64", "/etc/passwd", "/etc/ssl", "/sys", "/dev/urandom", pod, pod + "/volumes/cfg"} {
		if !slices.Contains(l.ReadExec, p) {
			t.Errorf("ReadExec lacks %s: %v", p, l.ReadExec)
		}
	}
	for _, p := range []string{pod + "/roots/app", "/srv/vol", "/proc", "/dev/null", "/dev/pts", "/dev/shm"} {
		if !slices.Contains(l.ReadWrite, p) {
			t.Errorf("ReadWrite lacks %s: %v", p, l.ReadWrite)
		}
	}
	// Denied by not being listed, nor any parent of theirs.
	for _, denied := range []string{"/home/u", "/root", "/run/k3sm/runtime.sock", "/run/docker.sock", "/var/lib/k3sm/admin.kubeconfig",
		"/var/lib/k3sm/pods/uid-2", "/var/log", "/tmp/x", "/etc/k3sm/registries.yaml", "/dev/sda", "/dev/mem"} {
		for _, p := range append(slices.Clone(l.ReadExec), l.ReadWrite...) {
			if p == "/" || p == denied || strings.HasPrefix(denied, p+"/") {
				t.Errorf("%s is reachable through %s", denied, p)
			}
		}
	}
	if got := nativePolicy(etc, pod, nil, nil); len(got.ReadWrite) != 1+len(nativeDevWrite) {
		t.Errorf("no volumes: ReadWrite %v", got.ReadWrite)
	}
}

// The host's /etc, without k3sm's configuration and the credentials.
func TestNativeEtc(t *testing.T) {
	etc := nativeEtc()
	if len(etc) == 0 {
		t.Fatal("no /etc entry is readable")
	}
	for _, p := range etc {
		if !strings.HasPrefix(p, "/etc/") || strings.Count(p, "/") != 2 {
			t.Errorf("%s is not an entry of /etc", p)
		}
		for _, d := range etcDenied {
			if p == "/etc/"+d {
				t.Errorf("%s is listed", p)
			}
		}
	}
	if !slices.IsSorted(etc) {
		t.Error("not sorted")
	}
}
