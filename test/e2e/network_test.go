package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// requirePodNetwork skips unless this run gives pods their own network: as
// root, inside the network namespace TestMain made.
func requirePodNetwork(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 || os.Getenv(inNetNSEnv) == "" {
		t.Skip("the pod network needs root (k3sm-netd) and a network namespace of the test's own")
	}
}

// netdPids are the server's k3sm-netd processes.
func (s *server) netdPids() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if filepath.Base(exe) != "k3sm-netd" || !strings.HasPrefix(cwd, s.dataDir) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(stat), ") Z ") {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// netdAllocations reads which pods hold an address from netd's state file.
func (s *server) netdAllocations(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "agent", "netd-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pods []struct {
			UID string `json:"uid"`
			IP  string `json:"ip"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("netd state: %v\n%s", err, b)
	}
	out := map[string]string{}
	for _, p := range st.Pods {
		out[p.UID] = p.IP
	}
	return out
}

// dialRead connects to addr from the node (this test's network namespace)
// and returns what the peer sends.
func dialRead(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

func hasIP(p *corev1.Pod) error {
	if err := running(p); err != nil {
		return err
	}
	if p.Status.PodIP == "" {
		return fmt.Errorf("no pod IP yet")
	}
	return nil
}

func TestPodNetwork(t *testing.T) {
	requirePodNetwork(t)
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)

	var cidr netip.Prefix
	waitFor(t, time.Minute, "node podCIDR", func() error {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cidr, err = netip.ParsePrefix(n.Spec.PodCIDR)
		return err
	})

	// A service only the host's loopback offers: pods must not reach it.
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			conn, err := hostLn.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("host only\n"))
			conn.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port

	for _, name := range []string{"net-a", "net-b"} {
		p := nativePod(name, imgs.prog, "serve:8080", "http:8081:/nonexistent", "forever")
		// Probes reach the pod's ports at its address, in its network.
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8081)}}}
		p.Spec.Containers[0].LivenessProbe = &corev1.Probe{PeriodSeconds: 1,
			ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
		s.createPod(t, p)
	}
	waitPod(t, c, "net-a", 2*time.Minute, readyWithIP)
	waitPod(t, c, "net-b", 2*time.Minute, readyWithIP)
	a := waitPod(t, c, "net-a", 2*time.Minute, hasIP)
	b := waitPod(t, c, "net-b", 2*time.Minute, hasIP)
	aIP, bIP := a.Status.PodIP, b.Status.PodIP
	for _, p := range []*corev1.Pod{a, b} {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !cidr.Contains(ip) || ip == cidr.Addr().Next() {
			t.Fatalf("pod %s IP %q: not a pod address of the node's %s", p.Name, p.Status.PodIP, cidr)
		}
		if len(p.Status.PodIPs) != 1 || p.Status.PodIPs[0].IP != p.Status.PodIP || p.Status.HostIP != "127.0.0.1" {
			t.Fatalf("pod %s: podIPs %v hostIP %q", p.Name, p.Status.PodIPs, p.Status.HostIP)
		}
	}
	if aIP == bIP {
		t.Fatalf("both pods got %s", aIP)
	}

	t.Run("pods both listen on :8080 and reach each other without NAT", func(t *testing.T) {
		out, err := s.kubectl("exec", "net-a", "--", "prog", "dial:"+net.JoinHostPort(bIP, "8080"))
		if err != nil || !strings.HasPrefix(out, "from "+aIP+":") || !strings.Contains(out, "to "+bIP+":8080") {
			t.Fatalf("a → b: %v %q (want from %s to %s:8080)", err, out, aIP, bIP)
		}
		out, err = s.kubectl("exec", "net-b", "--", "prog", "dial:"+net.JoinHostPort(aIP, "8080"))
		if err != nil || !strings.HasPrefix(out, "from "+bIP+":") || !strings.Contains(out, "to "+aIP+":8080") {
			t.Fatalf("b → a: %v %q", err, out)
		}
		// Containers of one pod share it: its own port on localhost.
		out, err = s.kubectl("exec", "net-a", "--", "prog", "dial:127.0.0.1:8080")
		if err != nil || !strings.HasPrefix(out, "from 127.0.0.1:") {
			t.Fatalf("a → its own localhost: %v %q", err, out)
		}
	})

	t.Run("Debian's nginx binds port 80 as the pod's root", func(t *testing.T) {
		s.createPod(t, nginxPod(t, "nginx"))
		p := waitPod(t, c, "nginx", 2*time.Minute, readyWithIP)
		if err := getNginx(p.Status.PodIP); err != nil {
			logs, _ := s.kubectl("logs", "nginx")
			t.Fatalf("%v; its log:\n%s", err, logs)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Errorf("nginx restarted %d times", rc)
		}
		// The tests below count the node's addresses: only net-a's and net-b's.
		s.deletePod(t, "nginx", 0)
		waitFor(t, time.Minute, "nginx's address released", func() error {
			if got := s.netdAllocations(t); len(got) != 2 {
				return fmt.Errorf("netd holds %v", got)
			}
			return nil
		})
	})

	t.Run("the node reaches every pod", func(t *testing.T) {
		for _, ip := range []string{aIP, bIP} {
			out, err := dialRead(net.JoinHostPort(ip, "8080"))
			if err != nil || !strings.Contains(out, "to "+ip+":8080") {
				t.Fatalf("node → %s: %v %q", ip, err, out)
			}
		}
	})

	t.Run("a pod does not reach the host's loopback", func(t *testing.T) {
		out, err := s.kubectl("exec", "net-a", "--", "prog", "dial:127.0.0.1:"+strconv.Itoa(hostPort))
		if err == nil || strings.Contains(out, "host only") {
			t.Fatalf("pod reached the host's 127.0.0.1:%d: %v %q", hostPort, err, out)
		}
	})

	t.Run("hostNetwork pods keep the node's network", func(t *testing.T) {
		p := nativePod("net-host", imgs.prog, "forever")
		p.Spec.HostNetwork = true
		s.createPod(t, p)
		h := waitPod(t, c, "net-host", 2*time.Minute, hasIP)
		if h.Status.PodIP != "127.0.0.1" {
			t.Fatalf("hostNetwork pod IP %q, want the node's 127.0.0.1", h.Status.PodIP)
		}
		out, err := s.kubectl("exec", "net-host", "--", "prog", "dial:127.0.0.1:"+strconv.Itoa(hostPort))
		if err != nil || !strings.Contains(out, "host only") {
			t.Fatalf("hostNetwork pod → host loopback: %v %q", err, out)
		}
		s.deletePod(t, "net-host", 0)
	})

	t.Run("status.podIP in env is the pod's own address", func(t *testing.T) {
		p := nativePod("net-env", imgs.prog, "env:MY_IP", "env:ADDR", "forever")
		p.Spec.Containers[0].Env = []corev1.EnvVar{
			{Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "ADDR", Value: "$(MY_IP):8080"},
		}
		s.createPod(t, p)
		e := waitPod(t, c, "net-env", 2*time.Minute, hasIP)
		waitLogs(t, s, "net-env", "MY_IP="+e.Status.PodIP+"\n")
		waitLogs(t, s, "net-env", "ADDR="+e.Status.PodIP+":8080\n")
		s.deletePod(t, "net-env", 0)
	})

	// The addresses outlive every k3sm process: a running pod keeps its
	// address and keeps serving on it.
	stillServing := func(t *testing.T, what string) {
		t.Helper()
		for _, name := range []string{"net-a", "net-b"} {
			p := waitPod(t, c, name, time.Minute, hasIP)
			want := map[string]string{"net-a": aIP, "net-b": bIP}[name]
			if p.Status.PodIP != want {
				t.Fatalf("after %s: %s has IP %s, had %s", what, name, p.Status.PodIP, want)
			}
			out, err := dialRead(net.JoinHostPort(want, "8080"))
			if err != nil || !strings.Contains(out, "to "+want+":8080") {
				t.Fatalf("after %s: %s no longer serves on %s: %v %q", what, name, want, err, out)
			}
		}
	}
	t.Run("addresses survive kill -9 of runtimed, the node and netd", func(t *testing.T) {
		for _, role := range []string{"runtimed", "node"} {
			old := s.oneChild(t, role)
			syscall.Kill(old, syscall.SIGKILL)
			s.waitRestarted(t, role, old)
			stillServing(t, "kill -9 of "+role)
		}
		old := s.netdPids()
		if len(old) != 1 {
			t.Fatalf("want one k3sm-netd, found %v", old)
		}
		syscall.Kill(old[0], syscall.SIGKILL)
		waitFor(t, 30*time.Second, "k3sm-netd restarted", func() error {
			if now := s.netdPids(); len(now) != 1 || now[0] == old[0] {
				return fmt.Errorf("netd processes %v", now)
			}
			return nil
		})
		stillServing(t, "kill -9 of k3sm-netd")
		// A new pod after netd's restart gets an address of its own.
		s.createPod(t, nativePod("net-c", imgs.prog, "serve:8080", "forever"))
		nc := waitPod(t, c, "net-c", 2*time.Minute, hasIP)
		if ip := nc.Status.PodIP; ip == aIP || ip == bIP {
			t.Fatalf("new pod got %s, in use by another pod", ip)
		}
		s.deletePod(t, "net-c", 0)
	})

	t.Run("addresses survive a server restart", func(t *testing.T) {
		s.stop()
		s.start()
		c = s.client()
		stillServing(t, "a server restart")
	})

	t.Run("100 pods get 100 addresses, all released on delete", func(t *testing.T) {
		const n = 100
		for i := range n {
			s.createPod(t, nativePod(fmt.Sprintf("burst-%d", i), imgs.prog, "forever"))
		}
		seen := map[string]string{aIP: "net-a", bIP: "net-b"}
		for i := range n {
			name := fmt.Sprintf("burst-%d", i)
			p := waitPod(t, c, name, 5*time.Minute, hasIP)
			if other, ok := seen[p.Status.PodIP]; ok {
				t.Fatalf("%s got %s, in use by %s", name, p.Status.PodIP, other)
			}
			seen[p.Status.PodIP] = name
		}
		if got := len(s.netdAllocations(t)); got != n+2 {
			t.Fatalf("netd holds %d addresses, want %d", got, n+2)
		}
		zero := int64(0)
		for i := range n {
			if err := c.CoreV1().Pods("default").Delete(ctx(t), fmt.Sprintf("burst-%d", i), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 3*time.Minute, "burst addresses released", func() error {
			alloc := s.netdAllocations(t)
			if len(alloc) != 2 || alloc[string(a.UID)] != aIP || alloc[string(b.UID)] != bIP {
				return fmt.Errorf("netd holds %d addresses: %v", len(alloc), alloc)
			}
			return nil
		})
		// Nothing of theirs is left on the node either.
		entries, _ := os.ReadDir(filepath.Join(s.dataDir, "run", "netns"))
		if len(entries) != 2 {
			t.Fatalf("%d pod network namespaces left, want 2", len(entries))
		}
	})
}
