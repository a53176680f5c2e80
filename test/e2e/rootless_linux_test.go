package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/roleconfig/netdconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// TestRootlessServer: `k3sm server` run by an unprivileged account with a
// subordinate id range runs a standard pod in the rootless sandbox: its
// image as "/", runAsUser and runAsGroup inside its user namespace (a
// subordinate id on the host), kubectl exec in the same boundary.
func TestRootlessServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the unprivileged account the server runs as")
	}
	const uid, sub = 64997, 3_100_000_000
	s := rootlessServer(t, "k3sm-e2e-rootless", uid, sub)
	imgs := buildImages(t)
	s.start()
	s.deletePodsAtCleanup(t)

	c := s.client()
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: imgs.prog,
		Args:            []string{"ids", "ls:/", "forever"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(2000))}}}}}
	pod.Name = "rootless"
	if _, err := c.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, "rootless", 2*time.Minute, running)
	var logs string
	waitFor(t, 30*time.Second, "the pod's output", func() error {
		out, err := s.kubectl("logs", "rootless")
		logs = out
		if err != nil || !strings.Contains(out, "ls /:") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if !strings.Contains(logs, "ids uid=1000 gid=2000") {
		t.Errorf("identity in the pod: %q", logs)
	}
	if strings.Contains(logs, " usr") || !strings.Contains(logs, " app") {
		t.Errorf("the pod's / is not its image: %q", logs)
	}
	pids := s.workloadPids()
	if len(pids) != 1 {
		t.Fatalf("workload processes %v, want 1", pids)
	}
	st, err := os.Stat(fmt.Sprintf("/proc/%d", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Sys().(*syscall.Stat_t).Uid; got != sub+999 {
		t.Errorf("the workload is host uid %d, want %d (the subordinate id of 1000)", got, sub+999)
	}
	out, err := s.kubectl("exec", "rootless", "--", "prog", "ids")
	if err != nil || !strings.Contains(out, "ids uid=1000 gid=2000") {
		t.Errorf("kubectl exec: %v: %q", err, out)
	}
	// Every process of the server runs as the account.
	for _, role := range []string{"kube-apiserver", "runtimed", "node"} {
		for _, pid := range s.childPids(role) {
			if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && fi.Sys().(*syscall.Stat_t).Uid != uid {
				t.Errorf("%s (pid %d) runs as uid %d", role, pid, fi.Sys().(*syscall.Stat_t).Uid)
			}
		}
	}
}

// rootlessServer is a server (not started) that runs as the account name
// (made for the test, with uid and a subordinate range from sub), from
// copies of the binaries that account can run.
func rootlessServer(t *testing.T, name string, uid int, sub uint32, extra ...string) *server {
	imagetest.RootlessAccount(t, name, uid, sub)
	// The binaries where the account can run them (the clone may be in
	// a directory only root enters).
	bin := t.TempDir()
	for _, d := range []string{bin, filepath.Dir(bin)} {
		os.Chmod(d, 0o755)
	}
	var bins []string
	for _, name := range []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"} {
		bins = append(bins, filepath.Join(filepath.Dir(k3smBin), name))
	}
	imagetest.CopyExecutables(t, bin, bins...)
	s := newServer(t, extra...)
	home := filepath.Join(s.dataDir, "home")
	os.Mkdir(home, 0o755)
	for _, d := range []string{s.dataDir, home} {
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	s.bin, s.env = filepath.Join(bin, "k3sm"), []string{"HOME=" + home}
	s.attr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return s
}

// TestRootlessServerPodNetwork: k3sm-netd run apart as root (as `k3sm
// install` runs it) and `k3sm server --netd-socket` as an unprivileged
// account: netd is the only privileged process, and pods get their own
// addresses, reach each other with their source kept, resolve and reach
// Services through the node's DNS and nftables, and kubectl exec works.
// The account has CAP_NET_BIND_SERVICE (as the unit gives it) for the
// cluster DNS on port 53.
func TestRootlessServerPodNetwork(t *testing.T) {
	requirePodNetwork(t)
	const uid, sub = 64995, 3_300_000_000
	netdDir := t.TempDir()
	os.Chmod(netdDir, 0o755)
	sock := filepath.Join(netdDir, "sock", "netd.sock")
	s := rootlessServer(t, "k3sm-e2e-rootnet", uid, sub, "--netd-socket", sock)
	s.attr.AmbientCaps = []uintptr{unix.CAP_NET_BIND_SERVICE}
	cfg := filepath.Join(netdDir, "netd.json")
	body, _ := json.Marshal(netdconfig.Config{Socket: sock, StateFile: filepath.Join(netdDir, "state.json"), NetNSDir: filepath.Join(netdDir, "netns"), AllowedUID: uid})
	if err := os.WriteFile(cfg, body, 0o600); err != nil {
		t.Fatal(err)
	}
	netdBin := filepath.Join(filepath.Dir(k3smBin), "k3sm-netd")
	netd := exec.Command(netdBin, "--config="+cfg)
	netdLog := &strings.Builder{}
	netd.Stdout, netd.Stderr = netdLog, netdLog
	if err := netd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netd.Process.Signal(syscall.SIGTERM)
		netd.Wait()
		// Its bridge, routes and tables go with it (this test's namespace).
		exec.Command(netdBin, "remove", "--config="+cfg).Run()
		if t.Failed() {
			t.Logf("k3sm-netd's log:\n%s", netdLog)
		}
	})
	waitFor(t, 10*time.Second, "k3sm-netd serving", func() error {
		_, err := os.Stat(sock)
		return err
	})
	imgs := buildImages(t)
	s.start()
	s.deletePodsAtCleanup(t)

	c := s.client()
	ips := map[string]string{}
	for _, name := range []string{"a", "b"} {
		pod := nativePod(name, imgs.prog, "serve:8080", "forever")
		pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To(int64(1000))}
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ips[name] = waitPod(t, c, name, 2*time.Minute, hasIP).Status.PodIP
	}
	if ips["a"] == ips["b"] || !strings.HasPrefix(ips["a"], "100.64.") {
		t.Fatalf("pod IPs %v", ips)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"test": "a"},
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	if _, err := c.CoreV1().Services("default").Create(ctx(t), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inB := func(args ...string) (string, error) {
		return s.kubectl(append([]string{"exec", "b", "--", "prog"}, args...)...)
	}
	out, err := inB("dial:" + ips["a"] + ":8080")
	if err != nil || !strings.Contains(out, "from "+ips["b"]+":") {
		t.Errorf("b dialing a by its address: %v: %q", err, out)
	}
	waitFor(t, 30*time.Second, "b reaching a through its Service by name", func() error {
		out, err = inB("dial:web.default.svc.cluster.local:80")
		if err != nil || !strings.Contains(out, "to "+ips["a"]+":8080") {
			return fmt.Errorf("%v: %q", err, out)
		}
		return nil
	})
	t.Logf("pods at %v; b through the Service web: %q", ips, out)
	if out, err := inB("ids"); err != nil || !strings.Contains(out, "uid=1000") {
		t.Errorf("kubectl exec: %v: %q", err, out)
	}
	// Debian's nginx as it comes: its master binds port 80 as the pod's
	// root, which is the account's subordinate id here.
	s.createPod(t, nginxPod(t, "nginx"))
	ngx := waitPod(t, c, "nginx", 2*time.Minute, readyWithIP)
	if err := getNginx(ngx.Status.PodIP); err != nil {
		logs, _ := s.kubectl("logs", "nginx")
		t.Errorf("rootless: %v; its log:\n%s", err, logs)
	}
	// netd is root; the server and all it starts are the account.
	for _, role := range []string{"kube-apiserver", "runtimed", "node"} {
		for _, pid := range s.childPids(role) {
			if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && fi.Sys().(*syscall.Stat_t).Uid != uid {
				t.Errorf("%s (pid %d) runs as uid %d", role, pid, fi.Sys().(*syscall.Stat_t).Uid)
			}
		}
	}
	if len(s.netdPids()) != 0 {
		t.Errorf("the server started a k3sm-netd of its own: %v", s.netdPids())
	}
	// A rootless runtime on a host that delegates it no cgroups (cgroup
	// v1, as on this build machine) cannot enforce pods' limits: status
	// says so (degraded, runtimed impaired, with the fix), never healthy.
	st, code := runExit(t, "status", "--data-dir", s.dataDir)
	healthy := code == 0 || (code == 4 && strings.Contains(st, "impaired: [runtimed]") && strings.Contains(st, "not enforced by the kernel"))
	if !healthy || !strings.Contains(st, "run apart from the server (--netd-socket)") {
		t.Errorf("k3sm status (exit %d):\n%s", code, st)
	}
}
