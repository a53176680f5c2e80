package agent

import (
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
)

func TestValidate(t *testing.T) {
	good := Config{Server: "https://192.0.2.10:9345", Token: "K10" + strings.Repeat("ab", 32) + "::abcdef.0123456789abcdef",
		NodeName: "worker-1", DataDir: "/var/lib/k3sm", KubeletPort: 10250, LBPort: DefaultLBPort, MaxPods: 110, Disk: diskpolicy.Default()}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for _, c := range []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"no server", func(c *Config) { c.Server = "" }, "--server"},
		{"http server", func(c *Config) { c.Server = "http://192.0.2.10:9345" }, "--server"},
		{"server without port", func(c *Config) { c.Server = "https://192.0.2.10" }, "https://HOST:PORT"},
		{"server with path", func(c *Config) { c.Server = "https://192.0.2.10:9345/v1" }, "--server"},
		{"no token", func(c *Config) { c.Token = "" }, "k3sm token create"},
		{"bad token", func(c *Config) { c.Token = "abcdef.0123456789abcdef" }, "--token"},
		{"node name", func(c *Config) { c.NodeName = "Worker_1" }, "--node-name"},
		{"node ip", func(c *Config) { c.NodeIP = "worker" }, "--node-ip"},
		{"kubelet port", func(c *Config) { c.KubeletPort = 0 }, "--kubelet-port"},
		{"lb port", func(c *Config) { c.LBPort = 70000 }, "--lb-server-port"},
		{"lb port is the kubelet's", func(c *Config) { c.LBPort = 10250 }, "--lb-server-port"},
		{"max pods", func(c *Config) { c.MaxPods = 0 }, "--max-pods"},
		{"relative netd socket", func(c *Config) { c.NetdSocket = "run/netd.sock" }, "--netd-socket"},
		{"netd socket with host network", func(c *Config) { c.NetdSocket, c.PodNetwork = "/run/k3sm/netd.sock", "host" }, "--pod-network=host"},
	} {
		cfg := good
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
