package localnode

import (
	"os"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

// Every file the node's role config names exists once the server issued
// the node's credentials, and the node reads back exactly what was written.
func TestNodeConfigNamesIssuedFiles(t *testing.T) {
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	cfg.NodeName, cfg.NodeIP = "n1", "127.0.0.1"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.DataDir+"/run", 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := controlplane.NewPlane(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := issueCredentials(p); err != nil {
		t.Fatal(err)
	}
	m, err := prepareMetricsAPI(p)
	if err != nil || m.port == 0 {
		t.Fatalf("metrics API: %+v %v", m, err)
	}
	nc := nodeConfig(p, m)
	for name, path := range map[string]string{"kubeconfig": nc.Kubeconfig, "servingCert": nc.ServingCert, "servingKey": nc.ServingKey,
		"clientCAFile": nc.ClientCAFile, "localPathKubeconfig": nc.LocalPathKubeconfig, "metrics.certFile": nc.Metrics.CertFile,
		"metrics.keyFile": nc.Metrics.KeyFile, "metrics.requestHeaderCAFile": nc.Metrics.RequestHeaderCAFile,
		"metrics.scrapeCertFile": nc.Metrics.ScrapeCertFile, "metrics.scrapeKeyFile": nc.Metrics.ScrapeKeyFile, "metrics.kubeletCAFile": nc.Metrics.KubeletCAFile} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if nc.Name != "n1" || nc.RuntimeSocket != p.Layout.RuntimeSocket() || nc.DataDir != cfg.DataDir || nc.Metrics.AllowedNames[0] != controlplane.AuthProxyUser {
		t.Errorf("%+v", nc)
	}
	args, err := roleconfig.Write(p.Layout.RoleConfig(roleconfig.Node), nc)
	if err != nil {
		t.Fatal(err)
	}
	var got roleconfig.NodeConfig
	if err := roleconfig.Read(roleconfig.Node, args, &got); err != nil || got.Disk != cfg.Disk || got.Metrics.Addr != nc.Metrics.Addr {
		t.Fatalf("%+v %v", got, err)
	}
	if rc := runtimeConfig(p); rc.Socket != nc.RuntimeSocket || rc.MaxPods != int64(cfg.MaxPods) || rc.Disk != cfg.Disk {
		t.Errorf("runtime config %+v", rc)
	}
}

// The node registers with the provider taint exactly when --node-taint says.
func TestNodeConfigCarriesTaint(t *testing.T) {
	for _, taint := range []bool{false, true} {
		cfg := controlplane.Defaults()
		cfg.DataDir, cfg.NodeTaint = t.TempDir(), taint
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		p, err := controlplane.NewPlane(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		if nc := nodeConfig(p, metricsAPI{}); nc.Taint != taint {
			t.Errorf("--node-taint=%v: node config Taint %v", taint, nc.Taint)
		}
	}
}
