//go:build linux

package podnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// onThreadIn runs f on an OS thread switched into the namespace at nsPath,
// and switches back. A namespace applies to one thread, and a Go program
// forks (and creates sockets) on the calling goroutine's thread; so f runs
// locked to that thread. If switching back fails, the thread stays locked
// and dies with its goroutine rather than serve others in the pod's
// network.
func onThreadIn(nsPath string, f func() error) error {
	target, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("pod network namespace: %w", err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("own network namespace: %w", err)
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter pod network namespace %s: %w", nsPath, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- ferr // leave the thread locked: it exits with this goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func dialIn(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := onThreadIn(nsPath, func() error {
		// The socket belongs to the namespace it was created in: once
		// made here, it stays in the pod's network whatever thread
		// later reads it. A literal address dials on this goroutine.
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	return conn, err
}

func startIn(nsPath string, start func() error) error {
	return onThreadIn(nsPath, start)
}

func pinned(nsPath string) bool {
	var st unix.Statfs_t
	return unix.Statfs(nsPath, &st) == nil && st.Type == unix.NSFS_MAGIC
}

func inNetNS(pid int, nsPath string) (in, known bool) {
	if !pinned(nsPath) {
		return false, false
	}
	var proc, pin unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &proc) != nil || unix.Stat(nsPath, &pin) != nil {
		return false, false
	}
	return proc.Dev == pin.Dev && proc.Ino == pin.Ino, true
}
