package pod

// Termination messages, as the kubelet makes them: an empty file mounted at
// the container's terminationMessagePath, read when the container exits.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
)

const (
	terminationLogName = "termination-log"
	// The kubelet's limits: the file's first 4096 bytes; a log's last 80
	// lines, at most 2048 bytes.
	maxTerminationMessage = 4096
	fallbackLogLines      = 80
	fallbackLogBytes      = 2048
)

// terminationMount makes the attempt's termination file, world-writable so
// whichever user the container runs as can write it, and mounts it at the
// container's terminationMessagePath unless a volume is mounted there.
func (p *managedPod) terminationMount(a *attempt, ms []mounts.Mount) (*mounts.Mount, error) {
	path := a.cspec.GetTerminationMessagePath()
	if path == "" || !mounts.Namespaced() {
		return nil, nil // darwin: the wrapper sandbox mounts nothing
	}
	target := filepath.Clean("/" + path)
	if slices.ContainsFunc(ms, func(m mounts.Mount) bool { return m.Target == target }) {
		return nil, nil
	}
	dir := p.m.dirs().PodAttemptDir(p.uid, a.name, int(a.n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, terminationLogName), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o666)
	if err != nil {
		return nil, fmt.Errorf("terminationMessagePath %s: %w", path, err)
	}
	err = f.Chmod(0o666) // whatever the umask
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("terminationMessagePath %s: %w", path, err)
	}
	return &mounts.Mount{Source: f.Name(), Target: target}, nil
}

// terminationMessage is what container c's attempt that ended with
// exitCode left in its termination file or, under FallbackToLogsOnError,
// the end of its log when it failed and left none.
func (p *managedPod) terminationMessage(c *container, exitCode int) string {
	p.mu.Lock()
	path, fallback := c.spec.GetTerminationMessagePath(), c.spec.GetTerminationMessageFallbackToLogs()
	dir, n := c.stateDir, c.restartCount
	p.mu.Unlock()
	if path == "" || dir == "" {
		return ""
	}
	var msg []byte
	if f, err := os.Open(filepath.Join(dir, terminationLogName)); err == nil {
		msg, _ = io.ReadAll(io.LimitReader(f, maxTerminationMessage))
		f.Close()
	}
	if len(msg) == 0 && fallback && exitCode != 0 {
		tail, err := criolog.Tail(filepath.Join(p.logDir(), c.name, fmt.Sprintf("%d.log", n)), fallbackLogLines, fallbackLogBytes)
		if err != nil {
			p.m.log.Warn("termination message from the log", "pod", p.key(), "container", c.name, "err", err)
		}
		return tail
	}
	return string(msg)
}
