package vmtest

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

func TestVersionNamesSuiteAndContent(t *testing.T) {
	v := Version()
	if !strings.HasPrefix(v, Suite+"-") || v != Version() {
		t.Fatalf("Version() = %q", v)
	}
	saved := Packages
	defer func() { Packages = saved }()
	Packages = append(append([]string{}, saved...), "curl")
	if Version() == v {
		t.Error("another package list has the same version: a machine would keep the old image")
	}
}

func TestAccelOverride(t *testing.T) {
	t.Setenv("K3SM_VM_ACCEL", "tcg")
	if KVM() {
		t.Error("K3SM_VM_ACCEL=tcg: KVM() true")
	}
	t.Setenv("K3SM_VM_ACCEL", "kvm")
	if !KVM() {
		t.Error("K3SM_VM_ACCEL=kvm: KVM() false")
	}
}

// The session writes stdout and stderr from two goroutines: one buffer
// for both must keep every byte (bytes.Buffer's ReadFrom would race).
func TestLockedWriterKeepsBothStreams(t *testing.T) {
	var b bytes.Buffer
	w := &lockedWriter{w: &b}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				w.Write([]byte("0123456789\n"))
			}
		}()
	}
	wg.Wait()
	if b.Len() != 2*1000*11 {
		t.Fatalf("%d bytes, want %d", b.Len(), 2*1000*11)
	}
}
