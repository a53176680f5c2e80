package server

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// RemoveNetwork (k3sm uninstall) takes everything netd made off the
// system: the recorded pods, what a crash left unrecorded, the node; then
// the state. A second run finds nothing to do.
func TestRemoveNetwork(t *testing.T) {
	e := newEnv(t)
	srv := e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	for i := range 3 {
		ok(t, setup(t, e.sock, uidN(i)))
	}
	srv.Close()
	orphan := filepath.Join(e.netns, uidN(7))
	os.WriteFile(orphan, nil, 0o600)
	e.dp.mu.Lock()
	e.dp.links[dataplane.HostIfName(uidN(8))] = dataplane.Pod{UID: uidN(8)}
	e.dp.mu.Unlock()

	n, err := RemoveNetwork(e.config(os.Getuid()))
	if err != nil || n != 3 {
		t.Fatalf("RemoveNetwork: %d pods, %v", n, err)
	}
	if e.dp.linkCount() != 0 || e.dp.node != nil {
		t.Fatalf("left %d links, node %v", e.dp.linkCount(), e.dp.node)
	}
	// The mesh's rules outlive its device (which went with netd).
	if e.dp.count("DelMesh 100.64.0.0/24") != 1 {
		t.Fatalf("RemoveNetwork did not remove the mesh: %v", e.dp.calls)
	}
	if entries, _ := os.ReadDir(e.netns); len(entries) != 0 {
		t.Fatalf("namespace files left: %v", entries)
	}
	if _, err := os.Stat(e.state); !os.IsNotExist(err) {
		t.Fatalf("state file left: %v", err)
	}
	e.dp.calls = nil
	if n, err := RemoveNetwork(e.config(os.Getuid())); err != nil || n != 0 || len(e.dp.calls) != 0 {
		t.Fatalf("second RemoveNetwork: %d, %v, calls %v", n, err, e.dp.calls)
	}
}

// A failure keeps the state file, so running it again retries.
func TestRemoveNetworkFailureKeepsState(t *testing.T) {
	e := newEnv(t)
	srv := e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	ok(t, setup(t, e.sock, uidN(0)))
	srv.Close()
	cfg := e.config(os.Getuid())
	cfg.NewDataplane = func() (dataplane.Dataplane, error) { return failingDel{e.dp}, nil }
	if _, err := RemoveNetwork(cfg); err == nil {
		t.Fatal("a failed DelNode was not reported")
	}
	if _, err := os.Stat(e.state); err != nil {
		t.Fatalf("state file gone after a failure: %v", err)
	}
}

type failingDel struct{ *fakeDP }

func (failingDel) DelNode(dataplane.Node) error { return errors.New("device busy") }
