package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const nodeName = "bench-node"

// server is one `k3sm server` on its own data dir, loopback ports only.
type server struct {
	mode    string // "real", "floor", "fair", "peer" or upstreamRatesMode
	instant bool   // the node starts nothing (the floors)
	node    string // the node its pods are pinned to
	// The peer is no server of its own: it joins cp's control plane and
	// uses cp's client.
	peer    *peer
	cp      *server
	dir     string
	logPath string
	cmd     *exec.Cmd
	waitErr chan error
	rc      *rest.Config
	c       kubernetes.Interface
}

// freePorts returns n distinct free ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// benchEviction are the node's hard eviction thresholds in the benchmark,
// the peer's too: a shared disk below the default 15% free must not taint
// the nodes DiskPressure (pods would stay Pending).
const benchEviction = "memory.available<1Mi,nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%"

// extraFlags returns the server flags the benchmark adds, for those the
// binary has (older binaries lack them): --eviction-hard, and --max-pods
// for room for want pods if more than the default 110 are wanted (else the
// density run is capped).
func extraFlags(bin string, want int) []string {
	out, _ := exec.Command(bin, "server", "--help").CombinedOutput()
	var flags []string
	if strings.Contains(string(out), "--eviction-hard") {
		flags = append(flags, "--eviction-hard", benchEviction)
	}
	if want > 110 && strings.Contains(string(out), "--max-pods") {
		flags = append(flags, "--max-pods", strconv.Itoa(want))
	}
	return flags
}

// upstreamRatesMode is a floor server (instant node) whose scheduler and
// controller-manager run with upstream's client rates, not k3sm's 200/s:
// the Deployment figure "before the rate-limit change" (issue 12), beside
// the floor with k3sm's rates.
const upstreamRatesMode = "floor-upstream-rates"

var upstreamRateFlags = []string{
	"--kube-controller-manager-arg=kube-api-qps=20", "--kube-controller-manager-arg=kube-api-burst=30",
	"--kube-scheduler-arg=kube-api-qps=50", "--kube-scheduler-arg=kube-api-burst=100",
}

// instantFlag is the hidden node flag that makes mode's server a floor: its
// node starts nothing. The fair floor's --node-instant-writes implies
// --node-instant and keeps a real start's API traffic (service-account
// token, ConfigMaps and Secrets read, Pending status, Pulled/Created/Started
// Events, Running status), so the real node's time beyond it is the cost of
// starting the pods; the floor's one status per pod is the API-only bound.
func instantFlag(mode string) string {
	switch mode {
	case "fair":
		return "--node-instant-writes"
	case "floor", upstreamRatesMode:
		return "--node-instant"
	}
	return ""
}

func serverArgs(dir string, ports []int, nodeFlag string, extra ...string) []string {
	args := []string{"server", "--data-dir", dir,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--https-listen-port", strconv.Itoa(ports[0]),
		"--scheduler-port", strconv.Itoa(ports[1]),
		"--controller-manager-port", strconv.Itoa(ports[2]),
		"--kubelet-port", strconv.Itoa(ports[3]),
		"--node-name", nodeName}
	if nodeFlag != "" {
		args = append(args, nodeFlag)
	}
	return append(args, extra...)
}

// startServer starts the server and waits until it logs `k3sm is up` and
// the "default" ServiceAccount exists (pods are refused before that). The
// mode says which node it runs (instantFlag).
func startServer(ctx context.Context, bin, work, mode string, qps float32, extra []string) (*server, error) {
	nodeFlag := instantFlag(mode)
	s := &server{mode: mode, instant: nodeFlag != "", node: nodeName, dir: filepath.Join(work, mode), logPath: filepath.Join(work, mode+".log")}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, serverArgs(s.dir, ports, nodeFlag, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.waitErr = make(chan error, 1)
	go func() { s.waitErr <- s.cmd.Wait() }()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		b, _ := os.ReadFile(s.logPath)
		if strings.Contains(string(b), "k3sm is up") {
			break
		}
		select {
		case err := <-s.waitErr:
			s.waitErr <- err
			return s, fmt.Errorf("%s server exited before it was up (%v); log %s:\n%s", mode, err, s.logPath, tail(string(b), 30))
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("%s server not up after 4m; log %s", mode, s.logPath)
		}
	}
	s.rc, err = clientcmd.BuildConfigFromFlags("", filepath.Join(s.dir, "admin.kubeconfig"))
	if err != nil {
		return s, err
	}
	// The benchmark must not be what limits the burst.
	s.rc.QPS, s.rc.Burst = qps, int(2*qps)
	s.rc.UserAgent = "k3sm-bench-pods"
	if s.c, err = kubernetes.NewForConfig(s.rc); err != nil {
		return s, err
	}
	err = poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		_, err := s.c.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return s, fmt.Errorf("%s server: default service account: %w", mode, err)
	}
	return s, nil
}

func (s *server) pid() int {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// stop sends SIGTERM and waits; the server stops its children. Shims are
// meant to outlive it, which is why pods are deleted before.
func (s *server) stop() error {
	if s == nil || s.cmd == nil || s.cmd.Process == nil || s.waitErr == nil {
		return nil
	}
	select {
	case err := <-s.waitErr:
		s.waitErr = nil
		return fmt.Errorf("%s server had exited: %v", s.mode, err)
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waitErr:
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.waitErr
		s.waitErr = nil
		return fmt.Errorf("%s server did not stop within 1m of SIGTERM; killed", s.mode)
	}
	s.waitErr = nil
	return nil
}

// alive reports an error if the server process has exited.
func (s *server) alive() error {
	if s.peer != nil {
		return errors.Join(s.cp.alive(), s.peer.alive())
	}
	select {
	case err := <-s.waitErr:
		s.waitErr <- err
		b, _ := os.ReadFile(s.logPath)
		return fmt.Errorf("%s server exited (%v); log %s:\n%s", s.mode, err, s.logPath, tail(string(b), 30))
	default:
		return nil
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// poll calls f until it returns nil or timeout passes.
func poll(ctx context.Context, timeout, every time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) {
			return stop.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(every):
		}
	}
}
