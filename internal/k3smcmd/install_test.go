package k3smcmd

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

// The server flags given to install are persisted in the unit, each as
// `k3sm server` parses it back; install's own flags are not.
func TestInstallDryRunPersistsServerFlags(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the systemd unit is rendered on Linux")
	}
	root := New(Upstream{}, nil)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"install", "--dry-run", "--data-dir", "/srv/k3sm", "--secrets-encryption", "--tls-san=a.example",
		"--tls-san", "b.example", "--audit-log", "--node-taint=false", "--pod-network", "host", "--timeout", "1m", "--bin-link=false",
		"--kube-apiserver-arg=enable-admission-plugins+=PodNodeSelector", "--kube-controller-manager-arg", "kube-api-qps=20",
		"--kube-controller-manager-arg=feature-gates=A=true,B=false"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	// --pod-network=host: no --netd-socket (the server refuses both).
	want := "ExecStart=/usr/local/lib/k3sm/k3sm server --data-dir /srv/k3sm --audit-log --kube-apiserver-arg=enable-admission-plugins+=PodNodeSelector --kube-controller-manager-arg=kube-api-qps=20 --kube-controller-manager-arg=feature-gates=A=true,B=false --node-taint=false --pod-network=host --secrets-encryption --tls-san=a.example --tls-san=b.example\n"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("dry run lacks\n%s\ngot:\n%s", want, out.String())
	}
}

func TestInstallRejectsBadServerFlags(t *testing.T) {
	for _, args := range [][]string{{"--pod-network", "bogus"}, {"--kube-scheduler-arg", "=1"}} {
		root := New(Upstream{}, nil)
		root.SetOut(&bytes.Buffer{})
		root.SetArgs(append([]string{"install", "--dry-run"}, args...))
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Fatalf("install %q: %v", args, err)
		}
	}
}

// Otherwise the server uses the installed k3sm-netd.
func TestInstallDryRunUsesTheNetdUnit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the systemd unit is rendered on Linux")
	}
	root := New(Upstream{}, nil)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"install", "--dry-run", "--data-dir", "/srv/k3sm", "--node-name", "edge-1"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=/usr/local/lib/k3sm/k3sm server --data-dir /srv/k3sm --netd-socket /run/k3sm/netd.sock --node-name=edge-1\n",
		"User=k3sm\n", "ExecStart=/usr/local/lib/k3sm/k3sm-netd --config=/etc/k3sm/netd.json\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run lacks %q:\n%s", want, out.String())
		}
	}
}

// The datastore endpoint (and its password) goes to the unit's
// environment file, which the dry run does not print.
func TestInstallKeepsTheDatastorePasswordOutOfTheUnit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the systemd unit is rendered on Linux")
	}
	root := New(Upstream{}, nil)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"install", "--dry-run", "--data-dir", "/srv/k3sm", "--datastore-endpoint=postgres://k3sm:Pw-s3cret@db.internal:5432/k3sm"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.Contains(got, "Pw-s3cret") || strings.Contains(got, "--datastore-endpoint=") ||
		!strings.Contains(got, "EnvironmentFile=/etc/systemd/system/k3sm.service.env\n") ||
		!strings.Contains(got, "# /etc/systemd/system/k3sm.service.env (mode 0600,") {
		t.Errorf("dry run:\n%s", got)
	}
}

// A joining server's token goes to the root-only environment file, as the
// datastore endpoint does, never into the unit.
func TestInstallKeepsAServersTokenOutOfTheUnit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the systemd unit is rendered on Linux")
	}
	root := New(Upstream{}, nil)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"install", "--dry-run", "--data-dir", "/srv/k3sm", "--datastore-endpoint=postgres://k3sm@db.internal:5432/k3sm",
		"--token", testToken, "--disable-agent"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.Contains(got, "0123456789abcdef") || strings.Contains(got, "--token=") || !strings.Contains(got, "# Secrets ($K3SM_DATASTORE_ENDPOINT, $K3SM_TOKEN)") ||
		!strings.Contains(got, "EnvironmentFile=/etc/systemd/system/k3sm.service.env\n") || !strings.Contains(got, "--disable-agent") {
		t.Errorf("dry run:\n%s", got)
	}
	if env := secretEnv(controlplane.Config{Token: testToken}); len(env) != 1 || env[0] != AgentTokenEnv+"="+testToken {
		t.Errorf("secretEnv = %v", env)
	}
}

const testToken = "K10abababababababababababababababababababababababababababababababab::abcdef.0123456789abcdef"

// install --agent: `k3sm agent` in k3sm-agent.service with the agent's
// flags as given, the installed netd's socket, and the token (flag or
// environment) nowhere in what anyone may read.
func TestInstallAgentDryRun(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the systemd unit is rendered on Linux")
	}
	for _, viaEnv := range []bool{false, true} {
		root := New(Upstream{}, nil)
		var out bytes.Buffer
		root.SetOut(&out)
		args := []string{"install", "--agent", "--dry-run", "--data-dir", "/srv/k3sm", "--server", "https://192.0.2.10:9345",
			"--node-name", "worker-1", "--max-pods", "50", "--mesh-port", "51821", "--node-taint=false"}
		if viaEnv {
			t.Setenv(AgentTokenEnv, testToken)
		} else {
			args = append(args, "--token", testToken)
		}
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"# /etc/systemd/system/k3sm-agent.service\n",
			"ExecStart=/usr/local/lib/k3sm/k3sm agent --data-dir /srv/k3sm --netd-socket /run/k3sm/netd.sock --max-pods=50 --mesh-port=51821 --node-name=worker-1 --node-taint=false --server=https://192.0.2.10:9345\n",
			"EnvironmentFile=/etc/systemd/system/k3sm-agent.service.env\n", "(mode 0600", "systemctl restart k3sm-agent.service\n"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("dry run lacks %q:\n%s", want, out.String())
			}
		}
		if strings.Contains(out.String(), "0123456789abcdef") || strings.Contains(out.String(), "k3sm server ") {
			t.Errorf("the dry run shows the token or runs a server:\n%s", out.String())
		}
	}
}

func TestInstallAgentRefusesWhatTheAgentWouldNot(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent", "--token", testToken}, "--server"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345"}, "k3sm token create"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345", "--token", "abcdef.0123456789abcdef"}, "--token"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345", "--token", testToken, "--secrets-encryption"}, "--secrets-encryption: a `k3sm server` flag"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345", "--token", testToken, "--netd-socket", "/x.sock"}, "--netd-socket"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345", "--token", testToken, "--kubeconfig", "/x"}, "--kubeconfig"},
		{[]string{"--agent", "--server", "https://192.0.2.10:9345", "--token", testToken, "--node-name", "Bad_Name"}, "--node-name"},
		// --server and --token are a server's flags too (joining a cluster
		// with embedded etcd); an agent's own flag without --agent is not.
		{[]string{"--lb-server-port", "7000"}, "add --agent"},
	} {
		root := New(Upstream{}, nil)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		root.SetArgs(append([]string{"install", "--dry-run"}, c.args...))
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("install %q: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
