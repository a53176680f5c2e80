package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestInstallAgentSystemd: `k3sm install --agent` under a real systemd
// joins a machine to a cluster installed on another: two systemd nodes on
// an internal Docker network the test makes (no route out). The agent's
// node runs as the unprivileged user beside a root k3sm-netd unit, its
// token only in a root-only file; a pod on it answers a pod on the server's
// node across the mesh with the caller's own address; the pod survives
// `systemctl restart k3sm-agent`; a second identical install changes
// nothing; uninstall leaves the machine as it was.
func TestInstallAgentSystemd(t *testing.T) {
	t.Parallel() // see TestInstallSystemd
	b := make([]byte, 4)
	rand.Read(b)
	network := "k3sm-e2e-" + hex.EncodeToString(b)
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (hack/start-docker.sh starts one): %v %s", err, out)
	}
	// --internal: no gateway, so nothing leaves the two nodes.
	if out, err := exec.Command("docker", "network", "create", "--internal", network).CombinedOutput(); err != nil {
		t.Fatalf("docker network create: %v %s", err, out)
	}
	// Registered first, so it runs after the nodes are removed.
	t.Cleanup(func() { exec.Command("docker", "network", "rm", network).Run() })
	srv := newSystemdNodeOn(t, network, "k3sm-server")
	agt := newSystemdNodeOn(t, network, "k3sm-agent-1")
	ip := func(n *systemdNode) string {
		out, err := exec.Command("docker", "inspect", "-f", `{{(index .NetworkSettings.Networks "`+network+`").IPAddress}}`, n.name).Output()
		if err != nil || strings.TrimSpace(string(out)) == "" {
			t.Fatalf("docker inspect %s: %v %q", n.name, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	srvIP := ip(srv)
	srv.copyBinaries()
	agt.copyBinaries()
	srv.must("useradd", "--create-home", "alice")
	agt.must("useradd", "--create-home", "alice")
	before, netBefore := agt.listing(), agt.network()

	srv.install("--bind-address=0.0.0.0", "--advertise-address="+srvIP)
	// stdout only: the token is its last line; what it says of it goes to stderr.
	lines := strings.Split(strings.TrimSpace(srv.must("sh", "-c", "k3sm token create --description install-e2e 2>/dev/null")), "\n")
	tok := lines[len(lines)-1]
	if !strings.HasPrefix(tok, "K10") {
		t.Fatalf("token create printed %q", tok)
	}
	secret := tok[strings.LastIndex(tok, ".")+1:]
	agentArgs := []string{"--agent", "--server", "https://" + srvIP + ":9345", "--token", tok}
	agt.installWaiting("node k3sm-agent-1 joined and is Ready", agentArgs...)

	// The unit: `k3sm agent` on the installed netd, as k3sm; the token
	// only in the root-only environment file.
	unit := agt.must("cat", "/etc/systemd/system/k3sm-agent.service")
	for _, want := range []string{"ExecStart=/usr/local/lib/k3sm/k3sm agent --data-dir /var/lib/k3sm --netd-socket /run/k3sm/netd.sock " +
		strings.ReplaceAll(testEvictionHard, "%", "%%") + " --server=https://" + srvIP + ":9345\n", "User=k3sm\n", "KillMode=process\n"} {
		if !strings.Contains(unit, want) {
			t.Fatalf("agent unit lacks %q:\n%s", want, unit)
		}
	}
	if out := agt.must("sh", "-c", "grep -rl -- '"+secret+"' /etc /usr/local /home/alice 2>/dev/null; true"); strings.TrimSpace(out) != "/etc/systemd/system/k3sm-agent.service.env" {
		t.Fatalf("the token's secret is in %q, want only the environment file", out)
	}
	if out := agt.must("stat", "-c", "%U %a", "/etc/systemd/system/k3sm-agent.service.env"); strings.TrimSpace(out) != "root 600" {
		t.Fatalf("token file: %s", out)
	}
	agt.onlyNetdIsRoot("k3sm-agent", "[k]3sm-runtimed|[k]3sm node|[k]3sm agent")
	// The mesh's private key: netd's (root's), outside the agent's reach.
	if out := agt.must("stat", "-c", "%U %a", "/var/lib/k3sm-netd/mesh-keys/node.key", "/var/lib/k3sm-netd/mesh-keys"); out != "root 600\nroot 700\n" {
		t.Fatalf("mesh key and its directory: %q", out)
	}
	if _, err := agt.exec("test", "-e", "/var/lib/k3sm/server"); err == nil {
		t.Fatal("the agent made a server's directory")
	}
	if out, _ := srv.kubectl("get", "nodes", "k3sm-server", "k3sm-agent-1", "--no-headers"); strings.Count(out, " Ready ") != 2 {
		t.Fatalf("nodes:\n%s", out)
	}

	// A pod on each node; the agent's answers with the caller's address.
	run := func(name, node string, cmd ...string) {
		t.Helper()
		overrides := `{"spec":{"nodeSelector":{"kubernetes.io/hostname":"` + node + `"}}}`
		if out, err := srv.kubectl(append([]string{"run", name, "--image=native", "--overrides", overrides, "--"}, cmd...)...); err != nil {
			t.Fatalf("kubectl run %s: %v %s", name, err, out)
		}
	}
	run("echo-b", "k3sm-agent-1", "/usr/bin/socat", "TCP-LISTEN:8080,fork,reuseaddr", "SYSTEM:echo $SOCAT_PEERADDR")
	run("sleeper", "k3sm-agent-1", "/bin/sleep", "3600")
	run("client-a", "k3sm-server", "/bin/sleep", "3600")
	for _, p := range []string{"echo-b", "sleeper", "client-a"} {
		srv.waitPodRunning(p)
	}
	podIP := func(name string) string {
		out, err := srv.kubectl("get", "pod", name, "-o", "jsonpath={.status.podIP}")
		if err != nil || out == "" {
			t.Fatalf("pod %s IP: %v %q", name, err, out)
		}
		return out
	}
	echoIP, clientIP := podIP("echo-b"), podIP("client-a")
	waitFor(t, 2*time.Minute, "pod on the server's node → pod on the installed agent, across the mesh", func() error {
		out, err := srv.kubectl("exec", "client-a", "--", "/usr/bin/socat", "-T3", "-", "TCP:"+echoIP+":8080")
		if err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		if got := strings.TrimSpace(out); got != clientIP {
			return fmt.Errorf("the agent's pod saw %q, want the caller's own address %s", got, clientIP)
		}
		return nil
	})
	// Each node writes its MeshPeer's status when it next reads its
	// device (within 10 s of a handshake while a peer is unsettled).
	waitFor(t, time.Minute, "both MeshPeers reachable", func() error {
		out, err := srv.kubectl("get", "meshpeers", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.reachable} {end}")
		if err != nil || strings.TrimSpace(out) != "k3sm-agent-1=true k3sm-server=true" {
			return fmt.Errorf("MeshPeers: %v %q", err, out)
		}
		return nil
	})
	pid := agt.workloadPid()
	if out := agt.must("cat", "/proc/"+pid+"/cgroup"); !strings.Contains(out, "k3sm-agent.service") {
		t.Fatalf("the pod's process is not in the agent unit's cgroup:\n%s", out)
	}

	// systemctl restart k3sm-agent: the agent re-attaches, the pod's
	// process is the same one.
	agt.must("systemctl", "restart", "k3sm-agent")
	waitFor(t, 3*time.Minute, "node k3sm-agent-1 Ready after systemctl restart k3sm-agent", func() error {
		if out, _ := agt.exec("systemctl", "is-active", "k3sm-agent"); strings.TrimSpace(out) != "active" {
			return fmt.Errorf("k3sm-agent: %s", out)
		}
		out, err := srv.kubectl("get", "node", "k3sm-agent-1", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil || out != "True" {
			return fmt.Errorf("%v %q", err, out)
		}
		return nil
	})
	agt.samePod(srv, "sleeper", pid, "systemctl restart k3sm-agent")

	// Again, unchanged: nothing rewritten, the agent not restarted.
	mainPid := agt.must("systemctl", "show", "-p", "MainPID", "--value", "k3sm-agent")
	if out := agt.installWaiting("joined and is Ready", agentArgs...); strings.Contains(out, "wrote ") || strings.Contains(out, "installed /") {
		t.Fatalf("a second identical agent install rewrote files:\n%s", out)
	}
	if now := agt.must("systemctl", "show", "-p", "MainPID", "--value", "k3sm-agent"); now != mainPid {
		t.Fatalf("a second identical install restarted the agent (%s, then %s)", mainPid, now)
	}
	// A server over the agent is refused.
	if out, err := agt.exec("k3sm", "install", "--timeout", "0"); err == nil || !strings.Contains(out, "installed k3sm agent") {
		t.Fatalf("a server install over the agent: %v\n%s", err, out)
	}

	// Uninstall, purged: the agent, its pods and its network go; the
	// machine is as before.
	out := agt.must("k3sm", "uninstall", "--purge")
	t.Logf("k3sm uninstall --purge (agent):\n%s", out)
	if !strings.Contains(out, "removed the pod network") {
		t.Fatalf("uninstall did not say it removed the pod network:\n%s", out)
	}
	agt.asBefore("k3sm uninstall --purge (agent)", "k3sm|sleep 3600|socat", before, netBefore)
}
