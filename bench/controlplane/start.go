package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// run is one measured start.
type run struct {
	Kind  string // "k3sm" or "floor"
	Warm  bool
	Round int

	// From process start (k3sm: the server; floor: the apiserver).
	Readyz time.Duration // apiserver /readyz first answers 200
	// k3sm only.
	Kine   time.Duration // kine's unix socket accepts
	UpLine time.Duration // the server logs "k3sm is up"
	Sched  time.Duration // scheduler /healthz 200
	CM     time.Duration // controller-manager /healthz 200
	AllUp  time.Duration // the last of Readyz, UpLine, Sched, CM
	// Child process starts relative to the server's, from /proc starttime
	// (10 ms resolution); -1 if unknown.
	KineSpawn, APISpawn, SchedSpawn, CMSpawn time.Duration
	// Spawn has the same for every child role, including addons (runtimed, node).
	Spawn map[string]time.Duration
	// The server's own figures from its log ("apiserver ready after=", "k3sm is up in").
	SelfReady, SelfUp string
	// Restarts is how many "restarting" lines the server logged during start.
	Restarts int

	// floor only: kine start -> its socket accepts (not part of Readyz).
	FloorKine time.Duration
}

// instance is a started k3sm server or floor (kine + apiserver).
type instance interface {
	pids() []int
	stop() error
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	// Hold all listeners until every port is picked so they differ.
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// httpsProbe GETs a loopback health URL. Its TLS material is loaded lazily
// because on a fresh data dir the server writes it only after it starts.
type httpsProbe struct {
	url                       string
	caFile, certFile, keyFile string // certFile empty: no client certificate
	client                    *http.Client
}

func (p *httpsProbe) ok(ctx context.Context) bool {
	if p.client == nil {
		ca, err := os.ReadFile(p.caFile)
		if err != nil {
			return false
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return false
		}
		tc := &tls.Config{RootCAs: pool}
		if p.certFile != "" {
			pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
			if err != nil {
				return false
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		p.client = &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 1}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return false
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (p *httpsProbe) close() {
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
}

func unixProbe(path string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "unix", path)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
}

// poll calls ok every interval until it succeeds and then sends the time
// elapsed since t0.
func poll(ctx context.Context, t0 time.Time, every time.Duration, ok func(context.Context) bool) <-chan time.Duration {
	ch := make(chan time.Duration, 1)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if ok(ctx) {
				ch <- time.Since(t0)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ch
}

func apiProbe(dataDir string, port int) *httpsProbe {
	tlsDir := filepath.Join(dataDir, "server", "tls")
	return &httpsProbe{
		url:      fmt.Sprintf("https://127.0.0.1:%d/readyz", port),
		caFile:   filepath.Join(tlsDir, "server-ca.crt"),
		certFile: filepath.Join(tlsDir, "client-admin.crt"),
		keyFile:  filepath.Join(tlsDir, "client-admin.key"),
	}
}

func healthProbe(dataDir string, port int) *httpsProbe {
	return &httpsProbe{
		url:    fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
		caFile: filepath.Join(dataDir, "server", "tls", "server-ca.crt"),
	}
}

// k3smServer is a running `k3sm server`.
type k3smServer struct {
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

func (k *k3smServer) pids() []int { return tree(k.cmd.Process.Pid) }

// stop sends SIGTERM, waits for the server to exit and checks that no child
// is left behind.
func (k *k3smServer) stop() error {
	defer k.log.Close()
	pids := k.pids()
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(2 * time.Minute):
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		return fmt.Errorf("k3sm server (pid %d) did not stop within 2m of SIGTERM; killed", k.cmd.Process.Pid)
	}
	return waitGone(pids, 30*time.Second)
}

func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			return fmt.Errorf("processes %v outlived their parent by %s; killed", left, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	reReady = regexp.MustCompile(`msg="apiserver ready" after=(\S+)`)
	reUp    = regexp.MustCompile(`k3sm is up in (\S+?):`)
)

// startK3sm starts `k3sm server` on dir and waits until every component is
// healthy. The returned server is still running.
func (b *bench) startK3sm(dir string) (*run, *k3smServer, error) {
	ports, err := freePorts(4)
	if err != nil {
		return nil, nil, err
	}
	logf, err := os.OpenFile(filepath.Join(b.logDir, filepath.Base(filepath.Dir(dir))+"-"+filepath.Base(dir)+".server.log"),
		os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, nil, err
	}
	cmd := exec.Command(b.bin, "server", "--data-dir", dir,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--https-listen-port", strconv.Itoa(ports[0]),
		"--scheduler-port", strconv.Itoa(ports[1]),
		"--controller-manager-port", strconv.Itoa(ports[2]),
		"--node-name", "bench")
	if b.kubeletPortFlag {
		// Servers that run their node take a kubelet API port too (default 10250).
		cmd.Args = append(cmd.Args, "--kubelet-port", strconv.Itoa(ports[3]))
	}
	cmd.Stdout, cmd.Stderr = logf, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	ctx, cancel := context.WithTimeout(context.Background(), b.opts.timeout)
	defer cancel()
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		logf.Close()
		return nil, nil, err
	}
	w.Close()
	k := &k3smServer{dir: dir, port: ports[0], cmd: cmd, exited: make(chan struct{}), log: logf}
	go func() { _ = cmd.Wait(); close(k.exited) }()
	b.track(k)

	res := &run{Kind: "k3sm", KineSpawn: -1, APISpawn: -1, SchedSpawn: -1, CMSpawn: -1}
	var mu sync.Mutex
	upLine := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			at := time.Since(t0)
			fmt.Fprintln(logf, line)
			mu.Lock()
			if m := reReady.FindStringSubmatch(line); m != nil {
				res.SelfReady = m[1]
			}
			if strings.Contains(line, "restarting") {
				res.Restarts++
			}
			if m := reUp.FindStringSubmatch(line); m != nil {
				res.SelfUp = m[1]
				upLine <- at
			}
			mu.Unlock()
		}
		r.Close()
	}()

	api, sched, cm := apiProbe(dir, ports[0]), healthProbe(dir, ports[1]), healthProbe(dir, ports[2])
	defer api.close()
	defer sched.close()
	defer cm.close()
	kineCh := poll(ctx, t0, b.opts.poll, unixProbe(filepath.Join(dir, "server", "kine.sock")))
	apiCh := poll(ctx, t0, b.opts.poll, api.ok)
	schedCh := poll(ctx, t0, b.opts.poll, sched.ok)
	cmCh := poll(ctx, t0, b.opts.poll, cm.ok)
	for pending := 5; pending > 0; pending-- {
		select {
		case d := <-kineCh:
			res.Kine = d
		case d := <-apiCh:
			res.Readyz = d
		case d := <-schedCh:
			res.Sched = d
		case d := <-cmCh:
			res.CM = d
		case d := <-upLine:
			res.UpLine = d
		case <-k.exited:
			b.untrack(k)
			return nil, nil, fmt.Errorf("k3sm server on %s exited before it was up; see %s", dir, logf.Name())
		case <-ctx.Done():
			_ = k.stop()
			b.untrack(k)
			return nil, nil, fmt.Errorf("k3sm server on %s not healthy after %s; see %s and %s/logs", dir, b.opts.timeout, logf.Name(), dir)
		}
	}
	res.AllUp = max(res.Readyz, res.UpLine, res.Sched, res.CM)
	pids := k.pids()
	res.KineSpawn = spawnOffset(pids, "kine")
	res.APISpawn = spawnOffset(pids, "kube-apiserver")
	if res.KineSpawn < 0 { // kine in the apiserver's process (issue 17)
		res.KineSpawn = res.APISpawn
	}
	res.SchedSpawn = spawnOffset(pids, "kube-scheduler")
	res.CMSpawn = spawnOffset(pids, "kube-controller-manager")
	// Both in one process since issue 17; a binary from before runs them apart.
	if res.SchedSpawn < 0 && res.CMSpawn < 0 {
		res.SchedSpawn = spawnOffset(pids, "kube-controllers")
		res.CMSpawn = res.SchedSpawn
	}
	res.Spawn = map[string]time.Duration{}
	for _, p := range pids[1:] {
		if r := role(p); r != "?" {
			if _, seen := res.Spawn[r]; !seen {
				res.Spawn[r] = spawnOffset(pids, r)
			}
		}
	}
	// The log reader keeps running; hand out a snapshot.
	mu.Lock()
	out := *res
	mu.Unlock()
	return &out, k, nil
}

// spawnOffset is how long after pids[0] (the server) the child with role r
// started, or -1.
func spawnOffset(pids []int, r string) time.Duration {
	pid := findRole(pids, r)
	if pid == 0 {
		return -1
	}
	srv, err1 := readStat(pids[0])
	ch, err2 := readStat(pid)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ch.startTick-srv.startTick) * time.Second / clockTicks
}

// floor is kine and kube-apiserver started directly, without the server.
type floor struct {
	dir       string
	kine, api *exec.Cmd
	kineDone  chan struct{}
	apiDone   chan struct{}
	logs      []*os.File
}

func (f *floor) pids() []int {
	var out []int
	for _, c := range []*exec.Cmd{f.api, f.kine} {
		if c != nil && c.Process != nil {
			out = append(out, tree(c.Process.Pid)...)
		}
	}
	return out
}

// stop stops the apiserver, then kine, as the supervisor does.
func (f *floor) stop() error {
	defer func() {
		for _, l := range f.logs {
			l.Close()
		}
	}()
	pids := f.pids()
	var errs []error
	for _, p := range []struct {
		cmd  *exec.Cmd
		done chan struct{}
	}{{f.api, f.apiDone}, {f.kine, f.kineDone}} {
		if p.cmd == nil || p.cmd.Process == nil {
			continue
		}
		killGroup(p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			killGroup(p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not stop within 1m of SIGTERM; killed", p.cmd.Args[1]))
		}
	}
	errs = append(errs, waitGone(pids, 30*time.Second))
	return errors.Join(errs...)
}

// floorArgs are the kine and apiserver command lines the server used in the
// template run, with the template's data dir and port as placeholders.
type floorArgs struct {
	templateDir string
	apiPort     int
	kine, api   []string // argv without the binary
}

func (fa floorArgs) forDir(args []string, dir string, port int) []string {
	out := make([]string, len(args))
	for i, a := range args {
		a = strings.ReplaceAll(a, fa.templateDir, dir)
		if strings.HasPrefix(a, "--secure-port=") {
			a = "--secure-port=" + strconv.Itoa(port)
		}
		out[i] = a
	}
	return out
}

// prepareFloorDir lays out dir as the server would before starting kine:
// server/{db,tls} with the template run's certificates, kine's role config
// (run/kine.json) pointing at dir, and an empty datastore.
func (b *bench) prepareFloorDir(dir string) error {
	for _, d := range []string{"server/db", "server/tls", "logs", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	src := filepath.Join(b.fa.templateDir, "server", "tls")
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "server", "tls", e.Name()), data, 0o600); err != nil {
			return err
		}
	}
	// Binaries from before typed role configs took kine's flags instead.
	if cfg, err := os.ReadFile(filepath.Join(b.fa.templateDir, "run", "kine.json")); err == nil {
		cfg = []byte(strings.ReplaceAll(string(cfg), b.fa.templateDir, dir))
		if err := os.WriteFile(filepath.Join(dir, "run", "kine.json"), cfg, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) startChild(dir, name string, args []string) (*exec.Cmd, chan struct{}, *os.File, error) {
	logf, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := exec.Command(b.bin, args...)
	cmd.Dir = filepath.Join(dir, "server")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return cmd, done, logf, nil
}

// startFloor starts kine, waits until it serves, then starts kube-apiserver
// with the server's flags and times it to /readyz.
func (b *bench) startFloor(dir string) (*run, *floor, error) {
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.timeout)
	defer cancel()
	f := &floor{dir: dir}
	res := &run{Kind: "floor", KineSpawn: -1, APISpawn: -1, SchedSpawn: -1, CMSpawn: -1}

	tk := time.Now()
	var logf *os.File
	f.kine, f.kineDone, logf, err = b.startChild(dir, "kine", b.fa.forDir(b.fa.kine, dir, port))
	if err != nil {
		return nil, nil, err
	}
	f.logs = append(f.logs, logf)
	b.track(f)
	select {
	case d := <-poll(ctx, tk, 5*time.Millisecond, unixProbe(filepath.Join(dir, "server", "kine.sock"))):
		res.FloorKine = d
	case <-f.kineDone:
		b.untrack(f)
		return nil, nil, fmt.Errorf("floor kine on %s exited; see %s/logs/kine.log", dir, dir)
	case <-ctx.Done():
		_ = f.stop()
		b.untrack(f)
		return nil, nil, fmt.Errorf("floor kine on %s not serving after %s", dir, b.opts.timeout)
	}

	api := apiProbe(dir, port)
	defer api.close()
	t0 := time.Now()
	f.api, f.apiDone, logf, err = b.startChild(dir, "kube-apiserver", b.fa.forDir(b.fa.api, dir, port))
	if err != nil {
		_ = f.stop()
		b.untrack(f)
		return nil, nil, err
	}
	f.logs = append(f.logs, logf)
	select {
	case d := <-poll(ctx, t0, b.opts.poll, api.ok):
		res.Readyz = d
	case <-f.apiDone:
		_ = f.stop()
		b.untrack(f)
		return nil, nil, fmt.Errorf("floor kube-apiserver on %s exited; see %s/logs/kube-apiserver.log", dir, dir)
	case <-ctx.Done():
		_ = f.stop()
		b.untrack(f)
		return nil, nil, fmt.Errorf("floor kube-apiserver on %s not ready after %s", dir, b.opts.timeout)
	}
	return res, f, nil
}
