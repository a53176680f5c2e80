package pod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// unreadable handles a pod directory whose pod.json cannot be loaded
// (corrupt, missing, another pod's): without its spec the pod cannot be
// managed, so its containers must not run on unmanaged. Every attempt's
// shim found under the directory is told to SIGKILL its workload's process
// group (a dead shim's workload is killed if it is provably still the
// process the shim started), the state file and logs move to
// <data>/quarantine/<uid>-<time>/, the rest of the directory is removed,
// and a Warning event PodStateUnreadable names what happened (the node
// posts it against the pod of that uid; namespace and name come from the
// pod's log directory, <ns>_<name>_<uid>, when there is one).
func (m *Manager) unreadable(uid string, cause error) {
	dir := m.podDir(uid)
	ns, name, logDir := m.namesFromLogs(uid)
	killed, failed := 0, 0
	attempts, _ := filepath.Glob(filepath.Join(m.dirs().PodAttemptsDir(uid), "*", "*"))
	for _, a := range attempts {
		proc, alive, err := m.cfg.Starter.Attach(a)
		if err != nil {
			continue // not an attempt a shim ever ran
		}
		if alive {
			if err := proc.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
				m.log.Warn("kill container of unreadable pod", "dir", a, "err", err)
			}
		}
		// Waiting also ends the workload of a shim that died.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = proc.Wait(ctx)
		cancel()
		switch {
		case err != nil:
			failed++
			m.log.Error("container of unreadable pod did not stop", "dir", a, "err", err)
		case alive:
			killed++
		}
	}
	q := filepath.Join(datadir.New(m.cfg.DataDir).QuarantineDir(), uid+"-"+time.Now().UTC().Format("20060102T150405Z"))
	kept := []string{}
	if err := os.MkdirAll(q, 0o700); err == nil {
		state := m.dirs().PodStateFile(uid)
		if os.Rename(state, filepath.Join(q, filepath.Base(state))) == nil {
			kept = append(kept, filepath.Base(state))
		}
		if logDir != "" && os.Rename(logDir, filepath.Join(q, "logs")) == nil {
			kept = append(kept, "logs")
		}
	}
	if failed == 0 {
		if err := os.RemoveAll(dir); err != nil {
			m.log.Error("remove unreadable pod directory", "dir", dir, "err", err)
		}
	}
	pod := uid
	if name != "" {
		pod = ns + "/" + name
	}
	msg := fmt.Sprintf("Runtime daemon restarted and cannot read this pod's state (%v): killed its %d running container(s) instead of leaving them unmanaged", cause, killed)
	if failed > 0 {
		msg += fmt.Sprintf("; %d container(s) did not stop, the pod directory %s is left in place", failed, dir)
	}
	if len(kept) > 0 {
		msg += fmt.Sprintf("; %s kept in %s", strings.Join(kept, " and "), q)
	}
	m.log.Error("pod state unreadable: containers killed, pod directory quarantined", "pod", pod, "uid", uid,
		"killed", killed, "notStopped", failed, "quarantine", q, "err", cause)
	m.hub.emit(&runtimev1.PodEvent{PodUid: uid, Namespace: ns, Name: name, Type: warning, Reason: "PodStateUnreadable", Message: msg})
}

// namesFromLogs recovers a pod's namespace and name from its log directory
// <data>/logs/pods/<ns>_<name>_<uid> (neither may contain "_").
func (m *Manager) namesFromLogs(uid string) (ns, name, dir string) {
	ms, _ := filepath.Glob(datadir.New(m.cfg.DataDir).PodLogDir("*", "*", uid))
	if len(ms) != 1 {
		return "", "", ""
	}
	parts := strings.SplitN(filepath.Base(ms[0]), "_", 3)
	if len(parts) != 3 || parts[2] != uid {
		return "", "", ""
	}
	return parts[0], parts[1], ms[0]
}
