package kubeconfig

import (
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// TestNoLockLeftBehind: kubectl (client-go's ModifyConfig) refuses to write
// while <config>.lock exists, so every Merge/Remove/UseContext must leave
// none behind, and kubectl must be able to write the file afterwards.
func TestNoLockLeftBehind(t *testing.T) {
	path, kind := setup(t)
	if _, err := Merge(path, kind, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := UseContext(path, "kind-dev"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".lock"); !os.IsNotExist(err) {
		t.Fatalf("%s.lock left behind after Merge/UseContext (stat: %v)", path, err)
	}
	// What `kubectl config use-context prod` does.
	po := clientcmd.NewDefaultPathOptions()
	po.LoadingRules.ExplicitPath = path
	cfg, err := po.GetStartingConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.CurrentContext = "prod"
	if err := clientcmd.ModifyConfig(po, *cfg, true); err != nil {
		t.Fatalf("kubectl-style write after Merge: %v", err)
	}
	if err := Remove(path, []string{"kind-dev"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".lock"); !os.IsNotExist(err) {
		t.Fatalf("%s.lock left behind after Remove (stat: %v)", path, err)
	}
}

// TestLockWaitsForKubectl: a lock held by another writer (kubectl creates
// the file exclusively) makes Merge wait, not interleave, and Merge goes on
// once it is released.
func TestLockWaitsForKubectl(t *testing.T) {
	path, kind := setup(t)
	if err := os.WriteFile(path+".lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.Remove(path + ".lock")
		close(released)
	}()
	if _, err := Merge(path, kind, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	default:
		t.Fatal("Merge wrote while another writer held the lock")
	}
}

// TestStaleLockNamesTheFix: a lock nobody releases ends in an error naming
// the lock file and what to do, and the kubeconfig is unchanged.
func TestStaleLockNamesTheFix(t *testing.T) {
	old := lockTimeout
	lockTimeout = 200 * time.Millisecond
	t.Cleanup(func() { lockTimeout = old })
	path, kind := setup(t)
	before := read(t, path)
	if err := os.WriteFile(path+".lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Merge(path, kind, MergeOptions{})
	if err == nil || !strings.Contains(err.Error(), path+".lock") || !strings.Contains(err.Error(), "remove") {
		t.Fatalf("error = %v, want one naming %s.lock and the fix", err, path)
	}
	if string(read(t, path)) != string(before) {
		t.Error("kubeconfig changed although the lock was not taken")
	}
}
