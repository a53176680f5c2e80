package pod

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

func persistPod(t *testing.T) *managedPod {
	t.Helper()
	m := &Manager{cfg: Config{DataDir: t.TempDir()}, hub: newHub(), log: slog.New(slog.DiscardHandler)}
	spec := &runtimev1.PodSpec{Uid: "u1", Name: "p", Namespace: "ns",
		Containers: []*runtimev1.ContainerSpec{{Name: "c", Image: NativeImage}}}
	p := m.newPod(spec)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSaveWritesPodJSONAlone(t *testing.T) {
	p := persistPod(t)
	for _, durable := range []bool{false, true} {
		if err := p.saveWith(durable); err != nil {
			t.Fatal(err)
		}
	}
	state := p.m.dirs().PodStateFile(p.uid)
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var pp persistedPod
	if err := json.Unmarshal(b, &pp); err != nil || len(pp.Containers) != 1 {
		t.Fatalf("pod.json %s: %v", b, err)
	}
	if st, _ := os.Stat(state); st.Mode().Perm() != 0o600 {
		t.Fatalf("pod.json mode %v", st.Mode())
	}
	entries, _ := os.ReadDir(p.dir)
	if len(entries) != 1 {
		t.Fatalf("want pod.json alone in the pod directory, got %v", entries)
	}
}

// A change that comes after deletion started neither writes pod.json nor
// makes the removed directory again, and its error is the one
// changedNotify keeps quiet about.
func TestSaveAfterDeleteDoesNotRecreateThePod(t *testing.T) {
	p := persistPod(t)
	p.saveMu.Lock()
	p.stateGone = true
	p.saveMu.Unlock()
	if err := os.RemoveAll(p.dir); err != nil {
		t.Fatal(err)
	}
	if err := p.save(); !os.IsNotExist(err) {
		t.Fatalf("save after delete: %v, want a not-exist error", err)
	}
	p.changedNotify()
	if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
		t.Fatalf("pod directory made again: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(p.dir)); err != nil {
		t.Fatal(err)
	}
}
