package pod

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
)

// The pod's resolver configuration reaches each container: as a mount over
// /etc/resolv.conf where containers have mount namespaces, else (darwin) as
// the environment of the getaddrinfo interposer, pointing at the same file.
func TestResolvConfReachesContainers(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, DNSShimLibName)
	os.WriteFile(lib, nil, 0o644)
	m := &Manager{cfg: Config{DataDir: dir, DNSShimLib: lib}}
	p := &managedPod{m: m, uid: "u1"}
	os.MkdirAll(datadir.New(dir).PodDir("u1"), 0o700)
	want := "nameserver 10.43.0.10\nsearch ns.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
	spec := &runtimev1.PodSpec{Uid: "u1", ResolvConf: want}

	mnt, env, err := p.resolvConf(spec)
	if err != nil {
		t.Fatal(err)
	}
	path := datadir.New(dir).PodResolvConf("u1")
	if b, err := os.ReadFile(path); err != nil || string(b) != want {
		t.Fatalf("pod resolv.conf %q %v", b, err)
	}
	if mounts.Namespaced() {
		if mnt == nil || *mnt != (mounts.Mount{Source: path, Target: "/etc/resolv.conf", ReadOnly: true}) || env != nil {
			t.Fatalf("with mount namespaces: mount %+v env %v", mnt, env)
		}
	} else if mnt != nil || !slices.Equal(env, []string{"DYLD_INSERT_LIBRARIES=" + lib, "K3SM_RESOLV_CONF=" + path}) {
		t.Fatalf("without mount namespaces: mount %+v env %v", mnt, env)
	}
	// The interposer's environment names the library and the file.
	if got := dnsShimEnv(lib, path); !slices.Equal(got, []string{"DYLD_INSERT_LIBRARIES=" + lib, ResolvConfEnv + "=" + path}) {
		t.Fatalf("dnsShimEnv %v", got)
	}
	// No rendered file: the container keeps the node's own.
	if mnt, env, err := p.resolvConf(&runtimev1.PodSpec{Uid: "u1"}); mnt != nil || env != nil || err != nil {
		t.Fatalf("no resolv.conf: %+v %v %v", mnt, env, err)
	}
	// A changed configuration replaces the file.
	spec.ResolvConf = "nameserver 192.0.2.53\n"
	if _, _, err := p.resolvConf(spec); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != spec.ResolvConf {
		t.Fatalf("after a change: %q", b)
	}
}
