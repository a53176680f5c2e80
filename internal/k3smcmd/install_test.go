package k3smcmd

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
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
