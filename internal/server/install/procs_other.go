//go:build !linux

package install

import "os"

// leftoverProcesses: launchd kills nothing of an AbandonProcessGroup job
// and keeps no cgroup, so the pods' processes cannot be found here yet;
// the server's own stop leaves them to the next start.
func leftoverProcesses(string) []int { return nil }

// purge removes the data dir.
func purge(dir string) error { return os.RemoveAll(dir) }
