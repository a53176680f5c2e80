//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
)

// userNSFD is where the init of a container that joins another
// (Spec.Join) gets the target's user namespace, for nsenter.
const userNSFD = 6

// target is the workload a debug container's init joins (Spec.Join): its
// namespaces, opened while it was provably that process.
type target struct {
	user, pid, uts, ipc *os.File
	// ownUser: the caller runs in the target's user namespace already (a
	// rootless runtime starts the shim in it), so the init is born there.
	ownUser bool
}

// openTarget opens the namespaces of the process j names, or says it is
// no longer running.
func openTarget(j *Join) (*target, error) {
	gone := fmt.Errorf("the target container's process %d is no longer running", j.Pid)
	pidfd, err := unix.PidfdOpen(j.Pid, 0)
	if err != nil {
		return nil, gone
	}
	defer unix.Close(pidfd)
	// The pidfd names one process whatever its pid becomes: the start time
	// read after it was opened proves the pid was still the target's, and
	// the process being alive after the namespaces were opened proves they
	// are its own.
	if j.StartTicks == 0 || procgroup.StartTicks(j.Pid) != j.StartTicks {
		return nil, gone
	}
	t := &target{}
	for _, ns := range []struct {
		f    **os.File
		name string
	}{{&t.user, "user"}, {&t.pid, "pid"}, {&t.uts, "uts"}, {&t.ipc, "ipc"}} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", j.Pid, ns.name))
		if err != nil {
			t.Close()
			return nil, gone
		}
		*ns.f = f
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		t.Close()
		return nil, gone
	}
	if sameFile(t.pid, "/proc/self/ns/pid") {
		t.Close()
		return nil, fmt.Errorf("the target container's process %d has no pid namespace of its own (it runs outside the sandbox)", j.Pid)
	}
	t.ownUser = sameFile(t.user, "/proc/self/ns/user")
	return t, nil
}

// Close closes the namespaces.
func (t *target) Close() {
	for _, f := range []*os.File{t.user, t.pid, t.uts, t.ipc} {
		if f != nil {
			f.Close()
		}
	}
}

// start starts cmd from a thread that joined the target's pid namespace
// (for the thread's children: cmd is born in it), UTS and IPC namespaces.
// The thread is never given back to the Go runtime: it ends with its
// goroutine.
func (t *target) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		for _, ns := range []struct {
			f    *os.File
			kind int
			name string
		}{{t.pid, unix.CLONE_NEWPID, "pid"}, {t.uts, unix.CLONE_NEWUTS, "UTS"}, {t.ipc, unix.CLONE_NEWIPC, "IPC"}} {
			if err := unix.Setns(int(ns.f.Fd()), ns.kind); err != nil {
				errc <- fmt.Errorf("join the target container's %s namespace: %w", ns.name, err)
				return
			}
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// sameFile reports whether f is the file at path (the same namespace).
func sameFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return errors.Join(err1, err2) == nil && os.SameFile(a, b)
}
