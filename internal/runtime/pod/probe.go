package pod

// Probes and lifecycle hooks, as the kubelet's prober and handler runner do
// them: exec runs a command the way the container's own command resolves
// (same env, working dir and path rules); httpGet, tcpSocket and grpc go to
// the probe's host, default the pod's IP, dialed from inside the pod's
// network (127.0.0.1 for a pod in the node's network).

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/procgroup"
)

// probeUserAgent is what the kubelet sends (kube-probe/<major>.<minor>).
const probeUserAgent = "kube-probe/1.37"

// maxProbeOutput bounds what an exec probe's output may add to an event,
// as the kubelet's 10 KiB limit.
const maxProbeOutput = 10 * 1024

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// errExecTimeout is an exec that did not finish within its timeout.
var errExecTimeout = errors.New("timed out")

// execIn runs command as the container would (its env, working dir and
// path rules), in its own process group that is killed when ctx ends. It
// returns the combined output and the exit code.
func (p *managedPod) execIn(ctx context.Context, c *container, command []string) (string, int, error) {
	if len(command) == 0 {
		return "", -1, errors.New("exec: command is empty")
	}
	p.mu.Lock()
	spec := p.spec
	cs := proto.Clone(c.spec).(*runtimev1.ContainerSpec)
	root := p.rootDir(c)
	digest := c.imageDigest
	boxed, stateDir := c.sandboxed, c.stateDir
	pid := 0
	if c.proc != nil && c.state.Terminated == nil {
		// Running, or still in its postStart hook.
		pid = c.proc.Pid()
	}
	p.mu.Unlock()
	cs.Command, cs.Args = command, nil
	img, _ := p.m.cfg.Images.Get(digest)
	if cs.GetImage() != NativeImage && img == nil {
		return "", -1, errors.New("container has not started yet")
	}
	if boxed && img == nil {
		root = nativeRoot
	}
	res, err := resolveProcess(spec, cs, img, root, boxed)
	if err != nil {
		return "", -1, err
	}
	p.mu.Lock()
	res.fillPodIP(p.net.IP)
	p.mu.Unlock()
	argv, dir, err := p.m.enter(boxed, stateDir, pid, res.Dir, res.Argv, "")
	if err != nil {
		return "", -1, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = res.Env, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &limitedBuffer{max: maxProbeOutput}
	cmd.Stdout, cmd.Stderr = out, out
	// A descendant that left the group may hold the output pipe.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return "", -1, err
	}
	// Whatever the command left behind in its group goes with it, killed
	// before the command is reaped (procgroup: no kill of a reused id).
	g := procgroup.New(cmd.Process.Pid, false)
	done := make(chan error, 1)
	go func() { done <- g.Wait(nil, cmd.Wait) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		g.Signal(syscall.SIGKILL)
		<-done
		return out.String(), -1, errExecTimeout
	}
	if cmd.ProcessState != nil {
		return out.String(), cmd.ProcessState.ExitCode(), nil
	}
	return out.String(), -1, err
}

// httpRequest builds the kubelet's request for an httpGet action.
func httpRequest(ctx context.Context, a *runtimev1.HTTPGetAction, defaultHost string) (*http.Request, error) {
	scheme := strings.ToLower(a.GetScheme())
	if scheme == "" {
		scheme = "http"
	}
	host := a.GetHost()
	if host == "" {
		host = defaultHost
	}
	path := a.GetPath()
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u, err := url.Parse(scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(a.GetPort()))) + path)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", probeUserAgent)
	req.Header.Set("Accept", "*/*")
	for _, h := range a.GetHeaders() {
		if strings.EqualFold(h.GetName(), "Host") {
			req.Host = h.GetValue()
			continue
		}
		req.Header.Add(h.GetName(), h.GetValue())
	}
	return req, nil
}

// httpDo sends req without keep-alives and without verifying certificates
// (as the kubelet); redirects are followed only to the same host.
func httpDo(req *http.Request, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*http.Response, error) {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DialContext: dial}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if len(via) >= 10 || r.URL.Hostname() != via[0].URL.Hostname() {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	var b limitedBuffer
	b.max = maxProbeOutput
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	return resp, nil
}

// runProbe runs one probe with its timeout. The message explains a failure
// the way the kubelet words it.
func (p *managedPod) runProbe(ctx context.Context, c *container, pr *runtimev1.Probe) (bool, string) {
	timeout := time.Duration(pr.GetTimeoutSeconds()) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch h := pr.GetHandler().(type) {
	case *runtimev1.Probe_Exec:
		out, code, err := p.execIn(tctx, c, h.Exec.GetCommand())
		switch {
		case errors.Is(err, errExecTimeout):
			return false, fmt.Sprintf("command %q timed out", strings.Join(h.Exec.GetCommand(), " "))
		case err != nil:
			return false, err.Error()
		case code != 0:
			if out == "" {
				return false, fmt.Sprintf("command %q exited with %d", strings.Join(h.Exec.GetCommand(), " "), code)
			}
			return false, out
		}
		return true, ""
	case *runtimev1.Probe_HttpGet:
		req, err := httpRequest(tctx, h.HttpGet, p.probeHost(""))
		if err != nil {
			return false, err.Error()
		}
		resp, err := httpDo(req, p.dialFunc())
		if err != nil {
			return false, err.Error()
		}
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return true, ""
	case *runtimev1.Probe_TcpSocket:
		host := p.probeHost(h.TcpSocket.GetHost())
		conn, err := p.dialFunc()(tctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(h.TcpSocket.GetPort()))))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	case *runtimev1.Probe_Grpc:
		return grpcProbe(tctx, p.probeHost(""), h.Grpc, timeout, p.dialFunc())
	}
	return false, "probe has no handler (exec, httpGet, tcpSocket or grpc)"
}

// grpcProbe asks the gRPC health service (grpc.health.v1.Health/Check).
func grpcProbe(ctx context.Context, host string, a *runtimev1.GRPCAction, timeout time.Duration, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (bool, string) {
	addr := net.JoinHostPort(host, strconv.Itoa(int(a.GetPort())))
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent(probeUserAgent),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }))
	if err != nil {
		return false, fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: a.GetService()})
	if err != nil {
		switch status.Code(err) {
		case codes.Unimplemented:
			return false, fmt.Sprintf("this server does not implement the grpc health protocol (grpc.health.v1.Health): %s", status.Convert(err).Message())
		case codes.DeadlineExceeded:
			return false, fmt.Sprintf("timeout: health rpc did not complete within %v", timeout)
		case codes.Unavailable:
			return false, fmt.Sprintf("timeout: failed to connect service %q within %v: %s", addr, timeout, status.Convert(err).Message())
		}
		return false, fmt.Sprintf("error: health rpc probe failed: %+v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return false, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String())
	}
	return true, ""
}

// probeKind names a probe in events and messages.
type probeKind string

const (
	startupProbe   probeKind = "Startup"
	readinessProbe probeKind = "Readiness"
	livenessProbe  probeKind = "Liveness"
)

// probeLoop runs pr from startedAt+initialDelaySeconds every periodSeconds
// until ctx ends. on is called with true once successThreshold consecutive
// probes passed and with false once failureThreshold consecutive probes
// failed (and again on every later probe, as the kubelet's results); it
// returns false to end the loop. Each failure is an Unhealthy event.
func (p *managedPod) probeLoop(ctx context.Context, c *container, kind probeKind, pr *runtimev1.Probe, startedAt time.Time, on func(bool) bool) {
	period := time.Duration(pr.GetPeriodSeconds()) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	successes, failures := int32(0), int32(0)
	succT, failT := max(pr.GetSuccessThreshold(), 1), pr.GetFailureThreshold()
	if failT <= 0 {
		failT = 3
	}
	next := startedAt.Add(time.Duration(pr.GetInitialDelaySeconds()) * time.Second)
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ok, msg := p.runProbe(ctx, c, pr)
		if ctx.Err() != nil {
			return
		}
		next = time.Now().Add(period)
		if ok {
			failures = 0
			successes++
			if successes >= succT && !on(true) {
				return
			}
			continue
		}
		successes = 0
		failures++
		p.event(warning, "Unhealthy", c.name, fmt.Sprintf("%s probe failed: %s", kind, msg))
		if failures >= failT && !on(false) {
			return
		}
	}
}

// probe runs a started attempt's probes: the startup probe first (the
// container is started once it passes; until then the others wait), then
// readiness and liveness. A startup or liveness failure sends the kill
// message on kill. A container without a readiness probe is ready once
// started.
func (p *managedPod) probe(ctx context.Context, c *container, cs *runtimev1.ContainerSpec, startedAt time.Time, restart bool, kill chan<- string) {
	suffix := ""
	if restart {
		suffix = ", will be restarted"
	}
	set := func(f func() bool) {
		p.mu.Lock()
		changed := ctx.Err() == nil && f()
		p.mu.Unlock()
		if changed {
			p.changedNotify()
		}
	}
	if sp := cs.GetStartupProbe(); sp != nil {
		passed := false
		p.probeLoop(ctx, c, startupProbe, sp, startedAt, func(ok bool) bool {
			if ok {
				passed = true
			} else {
				select {
				case kill <- fmt.Sprintf("Container %s failed startup probe%s", c.name, suffix):
				default:
				}
			}
			return false
		})
		if !passed {
			return
		}
	}
	rp := cs.GetReadinessProbe()
	set(func() bool {
		changed := !c.probeStarted || c.probeReady != (rp == nil)
		c.probeStarted = true
		c.probeReady = rp == nil
		return changed
	})
	if lp := cs.GetLivenessProbe(); lp != nil {
		go p.probeLoop(ctx, c, livenessProbe, lp, startedAt, func(ok bool) bool {
			if ok {
				return true
			}
			select {
			case kill <- fmt.Sprintf("Container %s failed liveness probe%s", c.name, suffix):
			default:
			}
			return false
		})
	}
	if rp != nil {
		go p.probeLoop(ctx, c, readinessProbe, rp, startedAt, func(ok bool) bool {
			set(func() bool {
				changed := c.probeReady != ok
				c.probeReady = ok
				return changed
			})
			return true
		})
	}
}

// startedWithoutProbe marks a running attempt without a startup probe
// started at once (and ready without a readiness probe), in the same status
// update that reports it Running. Caller holds the pod's mu.
func (c *container) startedWithoutProbe(cs *runtimev1.ContainerSpec) {
	if cs.GetStartupProbe() == nil && !c.probeStarted {
		c.probeStarted = true
		c.probeReady = cs.GetReadinessProbe() == nil
	}
}

// hookPodName is the kubelet's format.Pod: name_namespace(uid).
func (p *managedPod) hookPodName() string {
	return fmt.Sprintf("%s_%s(%s)", p.name, p.namespace, p.uid)
}

// runHook runs a postStart or preStop handler until it finishes or ctx
// ends. As the kubelet, an httpGet hook fails only when the request fails,
// not on its status code.
func (p *managedPod) runHook(ctx context.Context, c *container, h *runtimev1.LifecycleHandler) error {
	switch a := h.GetHandler().(type) {
	case *runtimev1.LifecycleHandler_Exec:
		out, code, err := p.execIn(ctx, c, a.Exec.GetCommand())
		if err == nil && code != 0 {
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(a.Exec.GetCommand(), " "), code, out)
		}
		if err != nil {
			return fmt.Errorf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q",
				a.Exec.GetCommand(), c.name, p.hookPodName(), err, out)
		}
		return nil
	case *runtimev1.LifecycleHandler_HttpGet:
		req, err := httpRequest(ctx, a.HttpGet, p.probeHost(""))
		if err == nil {
			_, err = httpDo(req, p.dialFunc())
		}
		if err != nil {
			return fmt.Errorf("HTTP lifecycle hook (%s) for Container %q in Pod %q failed - error: %v", a.HttpGet.GetPath(), c.name, p.hookPodName(), err)
		}
		return nil
	case *runtimev1.LifecycleHandler_SleepSeconds:
		t := time.NewTimer(time.Duration(a.SleepSeconds) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return nil
	case *runtimev1.LifecycleHandler_TcpSocket:
		return fmt.Errorf("lifecycle hook for Container %q in Pod %q: tcpSocket is not supported as a lifecycle handler (use exec, httpGet or sleep)", c.name, p.hookPodName())
	}
	return fmt.Errorf("lifecycle hook for Container %q in Pod %q has no handler", c.name, p.hookPodName())
}
