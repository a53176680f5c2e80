// Package doctor answers `k3sm doctor`: it checks what k3sm needs of the
// machine (kernel features, privileges, ports, the data dir, the clock, the
// cluster's certificates) and says for each PASS, WARN or FAIL with the fix.
// The probes that read the OS live in doctor_linux.go / doctor_darwin.go /
// doctor_other.go; the verdicts they feed are plain functions in
// verdicts.go, tested on every OS.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// Verdicts.
const (
	Pass = "PASS"
	Warn = "WARN"
	Fail = "FAIL"
)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	// Fix is what to do; empty on PASS.
	Fix string `json:"fix,omitempty"`
}

// Report is the --json schema of `k3sm doctor` (docs/operations.md).
type Report struct {
	DataDir string `json:"dataDir"`
	OS      string `json:"os"`
	// Result is the worst verdict: PASS, WARN or FAIL (exit status 1).
	Result string  `json:"result"`
	Checks []Check `json:"checks"`
}

// Options say what to check against.
type Options struct {
	DataDir string
	// Ports a server would listen on (the defaults of `k3sm server` when empty).
	Ports []Port
	Now   time.Time
}

// Port is one listener of a server.
type Port struct {
	Flag string
	Host string
	Port int
}

// DefaultPorts are what `k3sm server` listens on by default.
func DefaultPorts() []Port {
	d := controlplane.Defaults()
	return []Port{
		{"https-listen-port", d.BindAddress, d.HTTPSPort},
		{"kubelet-port", "0.0.0.0", d.KubeletPort},
		{"scheduler-port", "127.0.0.1", d.SchedulerPort},
		{"controller-manager-port", "127.0.0.1", d.ControllerManagerPort},
	}
}

// MinFreeBytes is the free space below which the data dir FAILs: the
// datastore, its snapshots and unpacked images need room to start at all.
const MinFreeBytes = 256 << 20

// Run checks everything.
func Run(o Options) *Report {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Ports == nil {
		o.Ports = DefaultPorts()
	}
	r := &Report{DataDir: o.DataDir, OS: osName()}
	r.Checks = append(r.Checks, privilege(os.Geteuid()))
	r.Checks = append(r.Checks, kernelChecks(existingParent(o.DataDir), o.DataDir)...)
	running, pid, lockErr := controlplane.ServerHoldsLock(o.DataDir)
	if lockErr != nil {
		running = false
	}
	r.Checks = append(r.Checks, ports(o, running, pid)...)
	r.Checks = append(r.Checks, dataDir(o.DataDir, lockErr))
	r.Checks = append(r.Checks, clock(o.Now))
	r.Checks = append(r.Checks, certificates(o.DataDir, o.Now))
	r.Checks = append(r.Checks, datastoreCheck(o.DataDir))
	r.Result = Pass
	for _, c := range r.Checks {
		if c.Status == Fail {
			r.Result = Fail
		} else if c.Status == Warn && r.Result == Pass {
			r.Result = Warn
		}
	}
	return r
}

func ports(o Options, running bool, pid int) []Check {
	if running {
		ps := o.Ports
		detail := "held by the k3sm server running on " + o.DataDir + " (pid " + strconv.Itoa(pid) + ")"
		if ri, err := controlplane.ReadRunInfo(o.DataDir); err == nil {
			ps = []Port{{"https-listen-port", "", portOf(ri.APIURL)}, {"kubelet-port", "", ri.KubeletPort},
				{"scheduler-port", "", ri.SchedulerPort}, {"controller-manager-port", "", ri.ControllerManagerPort}}
		}
		var list []string
		for _, p := range ps {
			list = append(list, strconv.Itoa(p.Port))
		}
		return []Check{{Name: "ports", Status: Pass, Detail: fmt.Sprintf("%v %s", list, detail)}}
	}
	var out []Check
	for _, p := range o.Ports {
		addr := net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
		}
		out = append(out, portVerdict(p, err))
	}
	return out
}

func portOf(url string) int {
	_, port, err := net.SplitHostPort(url[len("https://"):])
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// dataDir: writable (a temporary file is created and removed in it, or in
// its nearest existing parent when it does not exist yet) and with room.
func dataDir(dir string, lockErr error) Check {
	probe := existingParent(dir)
	var werr error
	if f, err := os.CreateTemp(probe, ".k3sm-doctor-*"); err != nil {
		werr = err
	} else {
		f.Close()
		os.Remove(f.Name())
	}
	if werr == nil && lockErr != nil {
		werr = lockErr
	}
	u, serr := diskUsage(probe)
	if serr != nil && werr == nil {
		werr = serr
	}
	th, _ := diskpolicy.ParseEvictionHard(diskpolicy.Default().EvictionHard)
	return diskVerdict(dir, probe, werr, u, th)
}

// existingParent is dir, or its nearest ancestor that exists.
func existingParent(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

func clock(now time.Time) Check {
	synced, known := ntpSynced()
	return clockVerdict(now, synced, known)
}

func certificates(dir string, now time.Time) Check {
	if _, err := os.Stat(datadir.New(dir).TLS("server-ca.crt")); errors.Is(err, os.ErrNotExist) {
		return Check{Name: "certificates", Status: Pass, Detail: "no cluster at " + dir + " yet: the first `k3sm server` issues them"}
	}
	list, err := certs.Check(dir, now)
	return certVerdict(list, err, now)
}

// datastoreCheck: the database the cluster lives in answers.
func datastoreCheck(dir string) Check {
	l := datadir.New(dir)
	rec, ok, err := datastore.Recorded(l)
	if err != nil || !ok {
		return datastoreVerdict(l, rec, ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return datastoreVerdict(l, rec, true, rec.Answer(ctx, l))
}
