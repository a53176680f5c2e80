package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/doctor"
	"github.com/k3sm-dev/k3sm/internal/server/status"
)

// runExit runs k3sm and returns its stdout and exit code.
func runExit(t *testing.T, args ...string) (string, int) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, k3smBin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out) + stderr.String(), ee.ExitCode()
	}
	t.Fatalf("k3sm %s: %v", strings.Join(args, " "), err)
	return "", -1
}

func statusJSON(t *testing.T, dataDir string) (*status.Report, int) {
	t.Helper()
	out, code := runExit(t, "status", "--data-dir", dataDir, "-o", "json")
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("status -o json (exit %d): %v\n%s", code, err, out)
	}
	if r.ExitCode != code {
		t.Fatalf("status says exitCode %d but exited %d", r.ExitCode, code)
	}
	return &r, code
}

func component(r *status.Report, name string) status.Component {
	for _, c := range r.Components {
		if c.Name == name {
			return c
		}
	}
	return status.Component{}
}

func unitInstalled() bool {
	for _, u := range status.ServiceUnitPaths() {
		if _, err := os.Stat(u); err == nil {
			return true
		}
	}
	return false
}

// status on an empty data dir, a running healthy server, a hung and a
// killed component, and a stopped server.
func TestStatusLifecycle(t *testing.T) {
	empty := t.TempDir()
	want := 5
	if unitInstalled() {
		want = 3 // a k3sm service is installed on this machine
	}
	if out, code := runExit(t, "status", "--data-dir", filepath.Join(empty, "none")); code != want || !strings.Contains(out, "k3sm server --data-dir") {
		t.Fatalf("status on an empty dir: exit %d (want %d)\n%s", code, want, out)
	}
	if _, err := os.Stat(filepath.Join(empty, "none")); !os.IsNotExist(err) {
		t.Fatalf("status created the data dir it was pointed at: %v", err)
	}

	s := newServer(t)
	s.start()
	// The node reports Ready shortly after "up"; status checks it.
	var r *status.Report
	waitFor(t, time.Minute, "status 0", func() error {
		var code int
		r, code = statusJSON(t, s.dataDir)
		if code != 0 {
			return fmt.Errorf("exit %d: %+v", code, r.Components)
		}
		return nil
	})
	names := []string{"server", "kine", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "runtimed", "netd", "node", "service-proxy", "dns", "mesh"}
	text, code := runExit(t, "status", "--data-dir", s.dataDir)
	if code != 0 || !strings.HasPrefix(text, "k3sm is running") {
		t.Fatalf("status text: exit %d\n%s", code, text)
	}
	t.Logf("status:\n%s", text)
	for _, n := range names {
		c := component(r, n)
		if c.Health != status.OK || c.Pid == 0 {
			t.Errorf("component %s: %+v, want ok with a pid", n, c)
		}
		if !strings.Contains(text, "\n"+n+" ") {
			t.Errorf("no line for %s in the text output", n)
		}
	}
	// The scheduler and controller-manager run in one process.
	ctrl := oneControllersProcess(t, s)
	for _, n := range []string{"kube-scheduler", "kube-controller-manager"} {
		if c := component(r, n); c.Pid != ctrl || !strings.Contains(c.Detail, "kube-controllers.log") {
			t.Errorf("%s: %+v, want pid %d (kube-controllers) and its log named", n, c, ctrl)
		}
	}
	// kine runs in the apiserver's process.
	api := oneAPIServerProcess(t, s)
	for _, n := range []string{"kine", "kube-apiserver"} {
		if c := component(r, n); c.Pid != api {
			t.Errorf("%s: %+v, want pid %d (kube-apiserver)", n, c, api)
		}
	}
	if c := component(r, "kine"); !strings.Contains(c.Detail, "kube-apiserver.log") {
		t.Errorf("kine: %+v, want the apiserver's log named", c)
	}
	if r.Server == nil || r.Server.Pid != s.cmd.Process.Pid || r.Server.Node != "e2e-node" {
		t.Errorf("server: %+v, want pid %d node e2e-node", r.Server, s.cmd.Process.Pid)
	}

	// A hung scheduler and controller-manager (stopped, not dead: the
	// supervisor does not restart them) are degraded, and healthy again
	// once they run.
	if err := syscall.Kill(ctrl, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r, code = statusJSON(t, s.dataDir)
	syscall.Kill(ctrl, syscall.SIGCONT)
	if code != 4 || r.State != status.Degraded || component(r, "kube-scheduler").Health != status.Unhealthy || component(r, "kube-controller-manager").Health != status.Unhealthy {
		t.Fatalf("hung scheduler: exit %d, %+v", code, r)
	}
	if c := component(r, "kube-apiserver"); c.Health != status.OK {
		t.Errorf("apiserver with a hung scheduler: %+v", c)
	}
	t.Logf("hung scheduler: %+v", component(r, "kube-scheduler"))
	waitFor(t, 30*time.Second, "status 0 after SIGCONT", func() error {
		if r, code := statusJSON(t, s.dataDir); code != 0 {
			return fmt.Errorf("exit %d: %+v", code, r.Components)
		}
		return nil
	})

	// A killed controller-manager (and with it the scheduler): degraded
	// until the supervisor's restart serves again, then running with one
	// restart.
	cm := []int{oneControllersProcess(t, s)}
	if err := syscall.Kill(cm[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sawDegraded := false
	var after status.Component
	waitFor(t, 2*time.Minute, "status 0 after the controller-manager's restart", func() error {
		r, code := statusJSON(t, s.dataDir)
		c := component(r, "kube-controller-manager")
		after = c
		if code == 4 && c.Health != status.OK {
			sawDegraded = true
		}
		if code != 0 || c.Restarts < 1 {
			return fmt.Errorf("exit %d: %+v", code, c)
		}
		if c.Pid == cm[0] {
			return fmt.Errorf("still the killed pid %d", c.Pid)
		}
		return nil
	})
	t.Logf("killed controller-manager: degraded seen: %v; after: %+v", sawDegraded, after)
	r, _ = statusJSON(t, s.dataDir)
	if sc := component(r, "kube-scheduler"); sc.Health != status.OK || sc.Pid != after.Pid || sc.Restarts != after.Restarts {
		t.Errorf("scheduler after the restart: %+v, want ok in the controller-manager's new process %d", sc, after.Pid)
	}
	if !strings.Contains(after.Detail, "restarted 1x, last killed by signal") {
		t.Errorf("the restart's cause is not in the detail: %q", after.Detail)
	}
	if !sawDegraded {
		t.Log("the restart served before status first looked (possible on a fast machine)")
	}

	// doctor on a running server: its ports are k3sm's, not a FAIL.
	var d doctor.Report
	out, _ := runExit(t, "doctor", "--data-dir", s.dataDir, "--json")
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	if c := doctorCheck(&d, "ports"); c.Status != doctor.Pass || !strings.Contains(c.Detail, "held by the k3sm server") {
		t.Errorf("doctor ports while running: %+v", c)
	}

	s.stop()
	out, code = runExit(t, "status", "--data-dir", s.dataDir)
	if code != 3 || !strings.Contains(out, "k3sm is stopped") || !strings.Contains(out, "k3sm server --data-dir "+s.dataDir) {
		t.Fatalf("status after stop: exit %d\n%s", code, out)
	}
	for _, f := range []string{"run/server.json", "run/components.json"} {
		if _, err := os.Stat(filepath.Join(s.dataDir, f)); !os.IsNotExist(err) {
			t.Errorf("%s left after the server stopped: %v", f, err)
		}
	}
}

func doctorCheck(r *doctor.Report, name string) doctor.Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return doctor.Check{}
}

func doctorJSON(t *testing.T, dataDir string) (*doctor.Report, int) {
	t.Helper()
	out, code := runExit(t, "doctor", "--data-dir", dataDir, "-o", "json")
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor -o json (exit %d): %v\n%s", code, err, out)
	}
	if (r.Result == doctor.Fail) != (code == 1) {
		t.Fatalf("doctor result %s but exit %d", r.Result, code)
	}
	return &r, code
}
