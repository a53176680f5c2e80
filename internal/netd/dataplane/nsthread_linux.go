package dataplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// onThread runs fn on a fresh OS thread, in ns if ns is valid, and puts the
// thread back in its original namespace afterwards. It is the only place
// that switches a thread's network namespace: everything else goes through
// netlink handles bound to a namespace. fn runs in its own goroutine so
// that a thread whose namespace cannot be restored is never unlocked: the
// goroutine exits locked and the Go runtime discards the thread instead of
// reusing it, in the wrong namespace, for other goroutines.
func onThread(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("dataplane: current network namespace: %w", err)
			return
		}
		defer orig.Close()
		var fnErr error
		if ns.IsOpen() {
			if err := netns.Set(ns); err != nil {
				fnErr = fmt.Errorf("dataplane: enter network namespace: %w", err)
			}
		}
		if fnErr == nil {
			fnErr = fn()
		}
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with this goroutine.
			done <- errors.Join(fnErr, fmt.Errorf("dataplane: restore network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- fnErr
	}()
	return <-done
}

// createNetNS makes a new network namespace and bind-mounts it on path
// (the parent directory 0700, the mount point an empty 0400 file), so the
// namespace lives without any process in it until DelPod unmounts it.
func createNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("dataplane: %w", err)
	}
	if f != nil {
		f.Close()
	}
	err = onThread(netns.None(), func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("dataplane: unshare network namespace: %w", err)
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("dataplane: bind-mount network namespace on %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		os.Remove(path) // only an unmounted file is left behind; best effort
	}
	return err
}

// isNetNS reports whether path is a mounted network namespace, as opposed
// to a missing file or the empty mount point left after a reboot.
func isNetNS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("dataplane: %w", err)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// removeNetNS unmounts and removes a namespace file; what is already gone
// is fine.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("dataplane: unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dataplane: %w", err)
	}
	return nil
}

// adoptNetNS pins the network namespace of process pid on netPath and its
// user namespace on userPath: a pod's namespaces made by a runtime that is
// not root (it can enter only namespaces its own user namespace owns). The
// namespaces are checked through the descriptors that are then pinned, so
// a pid reused meanwhile cannot slip another in: the network namespace
// must be owned by that user namespace, whose owner is uid owner (the
// runtime's, never root's).
func adoptNetNS(netPath, userPath string, pid, owner int) error {
	var fds [2]int
	for i, ns := range []string{"net", "user"} {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("dataplane: the %s namespace of process %d: %w", ns, pid, err)
		}
		defer unix.Close(fd)
		fds[i] = fd
	}
	netFD, userFD := fds[0], fds[1]
	ownerFD, err := unix.IoctlRetInt(netFD, unix.NS_GET_USERNS)
	if err != nil {
		return fmt.Errorf("dataplane: the owner of process %d's network namespace: %w", pid, err)
	}
	defer unix.Close(ownerFD)
	var got, want unix.Stat_t
	if err := errors.Join(unix.Fstat(ownerFD, &got), unix.Fstat(userFD, &want)); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fmt.Errorf("dataplane: process %d's network namespace is not owned by its user namespace", pid)
	}
	if err := checkRuntimeUserNS(userFD, owner); err != nil {
		return fmt.Errorf("dataplane: process %d: %w", pid, err)
	}
	// The runtime opens the pinned files to enter them: it may pass
	// through the directory (0711), not list or change it.
	dir := filepath.Dir(netPath)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	for i, path := range []string{netPath, userPath} {
		if err := pinNS(fds[i], path); err != nil {
			for _, p := range []string{netPath, userPath} {
				removeNetNS(p)
			}
			return fmt.Errorf("dataplane: process %d: %w", pid, err)
		}
	}
	return nil
}
