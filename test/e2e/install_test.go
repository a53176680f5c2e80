package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeImageRepo is klimax's offline kind node image (make node-image): a
// Debian with systemd as PID 1, which is what `k3sm install` needs.
const nodeImageRepo = "klimax/node"

// systemdNode is a privileged container of the node image running systemd
// as PID 1, with no network but its own loopback (--network none): every
// packet of the cluster inside it stays inside it.
type systemdNode struct {
	t    *testing.T
	name string
}

func newSystemdNode(t *testing.T) *systemdNode {
	t.Helper()
	return newSystemdNodeOn(t, "none", "k3sm-node")
}

// newSystemdNodeOn is a systemd node on a Docker network (one the test
// made, or none), with its own hostname (a node's default name).
func newSystemdNodeOn(t *testing.T, network, hostname string) *systemdNode {
	t.Helper()
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (hack/start-docker.sh starts one): %v %s", err, out)
	}
	// K3SM_E2E_SYSTEMD_IMAGE: another image with systemd as its init.
	image := os.Getenv("K3SM_E2E_SYSTEMD_IMAGE")
	if image == "" {
		out, err := exec.Command("docker", "images", nodeImageRepo, "--format", "{{.Repository}}:{{.Tag}}").Output()
		image = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
		if err != nil || image == "" {
			t.Skipf("no %s image: build it with `make node-image` (hack/node-image.sh); CI builds it before the tests", nodeImageRepo)
		}
	}
	b := make([]byte, 4)
	rand.Read(b)
	n := &systemdNode{t: t, name: "k3sm-e2e-install-" + hex.EncodeToString(b)}
	// As kind runs its nodes: privileged, /run and /tmp on tmpfs (a
	// reboot empties them), /var on a volume (not overlay on overlay).
	args := []string{"run", "-d", "--name", n.name, "--hostname", hostname, "--privileged",
		"--network", network, "--tmpfs", "/run", "--tmpfs", "/tmp", "--volume", "/var",
		"--volume", "/lib/modules:/lib/modules:ro", "--security-opt", "seccomp=unconfined",
		"--env", "container=docker", image}
	if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := n.exec("journalctl", "-u", "k3sm", "-u", "k3sm-agent", "-u", "k3sm-netd", "--no-pager", "-n", "120")
			t.Logf("journalctl -u k3sm -u k3sm-agent -u k3sm-netd (%s):\n%s", hostname, out)
			out, _ = n.kubectl("get", "nodes,pods,events", "-A", "-o", "wide")
			t.Logf("nodes, pods and events:\n%s", out)
			out, _ = n.kubectl("get", "nodes", "-o", "jsonpath={.items[*].spec.taints}")
			t.Logf("node taints: %s", out)
		}
		exec.Command("docker", "rm", "-f", "-v", n.name).Run()
	})
	n.waitBooted()
	// The image's kubelet (kind's, a unit file in /etc/systemd/system,
	// which systemctl cannot mask) must not hold the node API's port.
	n.must("systemctl", "disable", "--now", "kubelet.service")
	return n
}

// copyBinaries puts the built k3sm binaries in /root/k3sm-bin, where
// install takes them from.
func (n *systemdNode) copyBinaries() {
	n.t.Helper()
	bin := filepath.Dir(k3smBin)
	n.must("mkdir", "-p", "/root/k3sm-bin")
	for _, b := range []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			n.t.Fatalf("%v: build it with make bin/%s", err, b)
		}
		if out, err := exec.Command("docker", "cp", filepath.Join(bin, b), n.name+":/root/k3sm-bin/"+b).CombinedOutput(); err != nil {
			n.t.Fatalf("docker cp %s: %v %s", b, err, out)
		}
	}
}

func (n *systemdNode) exec(args ...string) (string, error) {
	out, err := exec.Command("docker", append([]string{"exec", n.name}, args...)...).CombinedOutput()
	return string(out), err
}

func (n *systemdNode) execEnv(env []string, args ...string) (string, error) {
	a := []string{"exec"}
	for _, e := range env {
		a = append(a, "--env", e)
	}
	out, err := exec.Command("docker", append(append(a, n.name), args...)...).CombinedOutput()
	return string(out), err
}

func (n *systemdNode) must(args ...string) string {
	n.t.Helper()
	out, err := n.exec(args...)
	if err != nil {
		n.t.Fatalf("in the node: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (n *systemdNode) waitBooted() {
	n.t.Helper()
	waitFor(n.t, 2*time.Minute, "systemd booted in "+n.name, func() error {
		out, _ := n.exec("systemctl", "is-system-running")
		if s := strings.TrimSpace(out); s != "running" && s != "degraded" {
			return fmt.Errorf("systemctl is-system-running: %q", s)
		}
		return nil
	})
}

func (n *systemdNode) kubectl(args ...string) (string, error) {
	return n.exec(append([]string{"k3sm", "kubectl"}, args...)...)
}

// listing is every path under the directories install writes to, so that
// a listing after uninstall can be compared with one before install.
func (n *systemdNode) listing() string {
	n.t.Helper()
	return n.must("sh", "-c", "find /etc /usr/local /home/alice -xdev 2>/dev/null | grep -v -e '^/etc/systemd/system/kubelet.service' -e '^/etc/machine-id' -e '^/etc/resolv.conf' | sort")
}

// network is the node's links, routes and nft tables: what netd adds and
// uninstall must take away.
func (n *systemdNode) network() string {
	n.t.Helper()
	return n.must("sh", "-c", "ip -o link show | cut -d: -f2 | sed 's/@.*//' | sort; ip route show | sort; nft list tables | sort")
}

func (n *systemdNode) workloadPid() string {
	n.t.Helper()
	var pid string
	waitFor(n.t, time.Minute, "the pod's process", func() error {
		out, _ := n.exec("pgrep", "-f", "^/bin/sleep 3600")
		f := strings.Fields(out)
		if len(f) != 1 {
			return fmt.Errorf("pgrep: %q", out)
		}
		pid = f[0]
		return nil
	})
	return pid
}

func (n *systemdNode) waitPodRunning(name string) {
	n.t.Helper()
	waitFor(n.t, 3*time.Minute, "pod "+name+" Running and ready", func() error {
		out, err := n.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].ready}")
		if err != nil || strings.TrimSpace(out) != "Running true" {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	})
}

// asBefore: after what (an uninstall) no process matching procs (pgrep
// -f) runs, and the files and network are as listed before the install.
func (n *systemdNode) asBefore(what, procs, before, netBefore string) {
	n.t.Helper()
	if out, _ := n.exec("pgrep", "-f", procs); strings.TrimSpace(out) != "" {
		n.t.Fatalf("processes left after %s: %s", what, out)
	}
	if after := n.listing(); after != before {
		n.t.Fatalf("%s left the machine different from before install:\n--- before ---\n%s\n--- after ---\n%s", what, before, after)
	}
	if after := n.network(); after != netBefore {
		n.t.Fatalf("%s left the pod network:\n--- before install ---\n%s\n--- after ---\n%s", what, netBefore, after)
	}
}

// onlyNetdIsRoot: the k3sm-netd unit runs as root; unit's main process,
// and every process matching procs (pgrep -f), as the user k3sm.
func (n *systemdNode) onlyNetdIsRoot(unit, procs string) {
	n.t.Helper()
	for unit, user := range map[string]string{"k3sm-netd": "root", unit: "k3sm"} {
		pid := strings.TrimSpace(n.must("systemctl", "show", "-p", "MainPID", "--value", unit))
		if out := n.must("stat", "-c", "%U", "/proc/"+pid); strings.TrimSpace(out) != user {
			n.t.Fatalf("%s runs as %s, want %s", unit, out, user)
		}
	}
	if out := n.must("sh", "-c", "ps -o user= -p \"$(pgrep -d, -f '"+procs+"')\" | sort -u"); strings.TrimSpace(out) != "k3sm" {
		n.t.Fatalf("the processes of %s run as %q, want only k3sm", unit, out)
	}
}

// samePod: pod (its process pid on n, its API object read through api)
// is Running with the same process and no restart after what happened.
func (n *systemdNode) samePod(api *systemdNode, pod, pid, after string) {
	n.t.Helper()
	api.waitPodRunning(pod)
	if now := n.workloadPid(); now != pid {
		n.t.Fatalf("the pod's process changed across %s: %s, then %s", after, pid, now)
	}
	if out, _ := api.kubectl("get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].restartCount}"); out != "0" {
		n.t.Fatalf("restartCount %q after %s", out, after)
	}
}

func (n *systemdNode) install(args ...string) string {
	n.t.Helper()
	return n.installWaiting("cluster is up", args...)
}

// installWaiting runs k3sm install and wants its wait to end saying want.
func (n *systemdNode) installWaiting(want string, args ...string) string {
	n.t.Helper()
	start := time.Now()
	// The machine's free space must not taint the node (testEvictionHard).
	out, err := n.execEnv([]string{"SUDO_USER=alice"}, append([]string{"/root/k3sm-bin/k3sm", "install", "--timeout", "4m", testEvictionHard}, args...)...)
	if err != nil || !strings.Contains(out, want) {
		n.t.Fatalf("k3sm install %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	n.t.Logf("k3sm install %s took %s:\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), out)
	return out
}

// TestInstallSystemd runs `k3sm install` under a real systemd: the unit
// runs the cluster, a pod survives `systemctl restart k3sm` (KillMode=
// process), a reboot brings the cluster and the pod back, and uninstall
// removes exactly what install made (the data dir only with --purge).
func TestInstallSystemd(t *testing.T) {
	// In parallel with the other install test: each is its own Docker
	// machines, and much of their time is waiting for systemd.
	t.Parallel()
	n := newSystemdNode(t)
	n.copyBinaries()
	n.must("useradd", "--create-home", "alice")
	before, netBefore := n.listing(), n.network()

	n.install("--secrets-encryption")
	if out, _ := n.exec("systemctl", "is-active", "k3sm"); strings.TrimSpace(out) != "active" {
		t.Fatalf("systemctl is-active k3sm: %s", out)
	}
	unit := n.must("cat", "/etc/systemd/system/k3sm.service")
	for _, want := range []string{"ExecStart=/usr/local/lib/k3sm/k3sm server --data-dir /var/lib/k3sm --netd-socket /run/k3sm/netd.sock " + strings.ReplaceAll(testEvictionHard, "%", "%%") + " --secrets-encryption\n",
		"User=k3sm\n", "KillMode=process\n", "Delegate=yes\n", "Restart=on-failure\n"} {
		if !strings.Contains(unit, want) {
			t.Fatalf("unit lacks %q:\n%s", want, unit)
		}
	}
	// k3sm-netd is the only privileged process: the server and all it
	// starts run as the unprivileged user k3sm.
	n.onlyNetdIsRoot("k3sm", "[k]3sm-runtimed|[k]3sm node|[k]ube-apiserver")
	if out := n.must("stat", "-c", "%a", "/var/lib/k3sm/server/cred/encryption-config.yaml"); strings.TrimSpace(out) != "600" {
		t.Fatalf("encryption config mode %s", out)
	}
	// alice's kubeconfig, hers, with the k3sm context current (her
	// kubectl caches elsewhere: ~/.kube/cache is not install's to remove).
	if out := n.must("stat", "-c", "%U %a", "/home/alice/.kube/config", "/home/alice/.kube"); out != "alice 600\nalice 700\n" {
		t.Fatalf("kubeconfig ownership: %q", out)
	}
	if out, err := n.exec("su", "alice", "-c", "k3sm kubectl --kubeconfig /home/alice/.kube/config --cache-dir /tmp/alice-kube-cache get nodes --no-headers"); err != nil || !strings.Contains(out, " Ready ") {
		t.Fatalf("alice's kubectl get nodes: %v\n%s", err, out)
	}

	// A pod (restartPolicy Always) and its process.
	if out, err := n.kubectl("run", "sleeper", "--image=native", "--", "/bin/sleep", "3600"); err != nil {
		t.Fatalf("kubectl run: %v %s", err, out)
	}
	n.must("k3sm", "kubectl", "create", "secret", "generic", "s1", "--from-literal=k=install-e2e-plaintext")
	n.waitPodRunning("sleeper")
	// As root the pod network is on: the node's bridge is there now.
	_, bridgeErr := n.exec("ip", "link", "show", "k3sm0")
	podNetwork := bridgeErr == nil
	t.Logf("pod network (bridge k3sm0) on: %v", podNetwork)
	pid := n.workloadPid()
	if out := n.must("cat", "/proc/"+pid+"/cgroup"); !strings.Contains(out, "k3sm.service") {
		t.Fatalf("the pod's process is not in the unit's cgroup:\n%s", out)
	}
	if out, err := n.exec("sh", "-c", "grep -c install-e2e-plaintext /var/lib/k3sm/server/db/state.db*"); err == nil {
		t.Fatalf("the Secret is plaintext in the datastore (%s)", out)
	}

	// systemctl restart: the server restarts, the pod's process does not.
	n.must("systemctl", "restart", "k3sm")
	waitFor(t, 3*time.Minute, "the apiserver after systemctl restart", func() error {
		out, err := n.kubectl("get", "--raw", "/readyz")
		if err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	})
	n.samePod(n, "sleeper", pid, "systemctl restart k3sm")

	// A reboot: the container stops (systemd shuts down, every process
	// ends, /run and /tmp are emptied) and starts again.
	// SIGRTMIN+3 is systemd's halt signal (what kind images set as
	// STOPSIGNAL): a clean shutdown, whatever the image says.
	for _, a := range [][]string{{"kill", "--signal=SIGRTMIN+3", n.name}, {"wait", n.name}, {"start", n.name}} {
		if out, err := exec.Command("docker", a...).CombinedOutput(); err != nil {
			t.Fatalf("docker %s: %v %s", strings.Join(a, " "), err, out)
		}
	}
	n.waitBooted()
	if out, _ := n.exec("systemctl", "is-enabled", "k3sm"); strings.TrimSpace(out) != "enabled" {
		t.Fatalf("k3sm not enabled after the reboot: %s", out)
	}
	waitFor(t, 4*time.Minute, "the cluster after the reboot", func() error {
		out, err := n.kubectl("get", "nodes", "--no-headers")
		if err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	})
	n.waitPodRunning("sleeper")
	if now := n.workloadPid(); now == pid {
		t.Fatalf("pid %s survived a reboot?", pid)
	}
	if out, err := n.kubectl("get", "secret", "s1", "-o", "jsonpath={.data.k}"); err != nil || out != "aW5zdGFsbC1lMmUtcGxhaW50ZXh0" {
		t.Fatalf("secret after the reboot: %v %q", err, out)
	}

	// Install again, unchanged: idempotent, no restart of the server.
	mainPid := n.must("systemctl", "show", "-p", "MainPID", "--value", "k3sm")
	out := n.install("--secrets-encryption")
	if strings.Contains(out, "wrote ") || strings.Contains(out, "installed /") {
		t.Fatalf("a second identical install rewrote files:\n%s", out)
	}
	if now := n.must("systemctl", "show", "-p", "MainPID", "--value", "k3sm"); now != mainPid {
		t.Fatalf("a second identical install restarted the server (%s, then %s)", mainPid, now)
	}

	// Uninstall: the service and the pods stop, what install made goes,
	// the data dir stays.
	out = n.must("k3sm", "uninstall")
	t.Logf("k3sm uninstall:\n%s", out)
	n.asBefore("k3sm uninstall", "k3sm|sleep 3600", before, netBefore)
	if podNetwork && !strings.Contains(out, "removed the pod network") {
		t.Fatalf("uninstall did not say it removed the pod network:\n%s", out)
	}
	if _, err := n.exec("test", "-f", "/var/lib/k3sm/server/db/state.db"); err != nil {
		t.Fatal("uninstall without --purge removed the datastore")
	}

	// The kept data dir brings the same cluster back; --purge removes it.
	n.install("--secrets-encryption")
	n.waitPodRunning("sleeper")
	out = n.must("k3sm", "uninstall", "--purge")
	t.Logf("k3sm uninstall --purge:\n%s", out)
	if out, err := n.exec("ls", "-A", "/var/lib/k3sm"); err == nil {
		t.Fatalf("uninstall --purge left the data dir: %s", out)
	}
	n.asBefore("k3sm uninstall --purge", "k3sm|sleep 3600", before, netBefore)
}
