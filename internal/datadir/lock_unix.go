//go:build unix

package datadir

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive, non-blocking lock on the data directory's lock
// file (LockFile) so that a second server or agent cannot run on the same
// data. The kernel drops the lock when the process dies, however it dies.
// role names the holder in the refusal the next one gets ("server", "agent").
func Lock(path, role string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if _, perr := strconv.Atoi(pid); perr != nil {
				pid = "unknown"
			}
			return nil, fmt.Errorf("another k3sm %s (pid %s) is using this data directory", role, pid)
		}
		return nil, err
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

// LockHeld reports whether a process holds the lock file at path, and the
// pid it wrote, without creating the file. Testing takes the lock for an
// instant, as `k3sm snapshot restore` does: a server starting in that
// instant fails its preflight and says another server runs.
func LockHeld(path string) (held bool, pid int, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			raw, _ := os.ReadFile(path)
			pid, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
			return true, pid, nil
		}
		return false, 0, err
	}
	return false, 0, nil
}
