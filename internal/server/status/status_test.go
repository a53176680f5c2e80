package status

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

func TestExitCodes(t *testing.T) {
	for state, code := range map[string]int{Running: 0, Stopped: 3, Degraded: 4, NotInstalled: 5, "?": 1} {
		if got := ExitCode(state); got != code {
			t.Errorf("%s: %d, want %d", state, got, code)
		}
	}
}

func check(t *testing.T, dir string, units []string) *Report {
	t.Helper()
	r, err := Check(context.Background(), dir, Options{Units: units, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != ExitCode(r.State) {
		t.Fatalf("exit code %d for %s", r.ExitCode, r.State)
	}
	return r
}

func TestNotInstalledAndStopped(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if r := check(t, dir, []string{}); r.State != NotInstalled || !strings.Contains(r.Hint, "k3sm install") {
		t.Fatalf("empty: %+v", r)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("status created the data dir")
	}
	// A service installed, no cluster yet: stopped, started through the service.
	unit := filepath.Join(t.TempDir(), "k3sm.service")
	os.WriteFile(unit, nil, 0o644)
	if r := check(t, dir, []string{unit, "/nonexistent"}); r.State != Stopped || len(r.ServiceUnits) != 1 || !strings.Contains(r.Hint, StartCommand()) {
		t.Fatalf("unit only: %+v", r)
	}
	// A cluster, no server.
	l := datadir.New(dir)
	if err := atomicfile.WriteFile(l.TLS("server-ca.crt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := check(t, dir, []string{})
	if r.State != Stopped || !r.Cluster || !strings.Contains(r.Hint, "k3sm server --data-dir "+dir) {
		t.Fatalf("stopped: %+v", r)
	}
}

// A lock held without the server's state files (a server still starting,
// or an older one) is degraded, not running.
func TestLockWithoutStateIsDegraded(t *testing.T) {
	dir := t.TempDir()
	release, err := controlplane.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	r := check(t, dir, []string{})
	if r.State != Degraded || r.Components[0].Name != "server" || r.Components[0].Health != Unhealthy || r.Components[0].Pid != os.Getpid() {
		t.Fatalf("%+v", r)
	}
}

// With the state files, a child whose pid is gone is down, and the node's
// Service proxy and DNS are off without netd.
func TestDeadChildIsDown(t *testing.T) {
	dir := t.TempDir()
	release, err := controlplane.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	l := datadir.New(dir)
	atomicfile.WriteFile(l.ServerInfoFile(), []byte(`{"pid":1,"apiURL":"https://127.0.0.1:1","nodeName":"n"}`), 0o600)
	atomicfile.WriteFile(l.ComponentsFile(), []byte(`{"pid":1,"children":[{"name":"kube-apiserver","pid":0,"restarts":2,"lastExit":"killed by signal killed"}]}`), 0o600)
	r := check(t, dir, []string{})
	if r.State != Degraded {
		t.Fatalf("%+v", r)
	}
	got := map[string]Component{}
	for _, c := range r.Components {
		got[c.Name] = c
	}
	// kine runs in the apiserver's process: both are down with it.
	for _, n := range []string{"kine", "kube-apiserver"} {
		if c := got[n]; c.Health != Down || c.Restarts != 2 || !strings.Contains(c.Detail, "killed by signal killed") || !strings.Contains(c.Detail, "kube-apiserver.log") {
			t.Errorf("%s: %+v", n, c)
		}
	}
	if c := got["kube-scheduler"]; c.Health != Down || !strings.Contains(c.Detail, "not started") {
		t.Errorf("scheduler: %+v", c)
	}
	for _, n := range []string{"netd", "service-proxy", "dns"} {
		if got[n].Health != Off {
			t.Errorf("%s: %+v, want off", n, got[n])
		}
	}
}

// A server without a node (--disable-agent) shows the node's parts off,
// saying why, and is not degraded by them.
func TestDisableAgentNodePartsOff(t *testing.T) {
	dir := t.TempDir()
	release, err := controlplane.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	l := datadir.New(dir)
	atomicfile.WriteFile(l.ServerInfoFile(), []byte(`{"pid":1,"apiURL":"https://127.0.0.1:1","nodeName":"n","meshPort":51820,"disableAgent":true}`), 0o600)
	atomicfile.WriteFile(l.ComponentsFile(), []byte(`{"pid":1,"children":[]}`), 0o600)
	r := check(t, dir, []string{})
	for _, c := range r.Components {
		switch c.Name {
		case "runtime", "netd", "node", "service-proxy", "dns", "mesh":
			if c.Health != Off || !strings.Contains(c.Detail, "--disable-agent") {
				t.Errorf("%s: %+v, want off naming --disable-agent", c.Name, c)
			}
		}
	}
}
