package controlplane

import (
	"strings"
	"testing"
)

func TestServiceProxyMode(t *testing.T) {
	for _, tc := range []struct {
		mode, goos string
		euid       int
		podNetwork string
		netd       string // --netd-socket
		want       string
	}{
		{"auto", "linux", 0, "auto", "", "nftables"},
		{"", "linux", 0, "netns", "", "nftables"},
		{"auto", "linux", 1000, "auto", "", "userspace"},
		{"auto", "darwin", 0, "auto", "", "userspace"},
		{"auto", "linux", 0, "host", "", "userspace"},
		{"userspace", "linux", 0, "auto", "", "userspace"},
		{"nftables", "linux", 0, "auto", "", "nftables"},
		// A netd run apart serves a server that is not root.
		{"auto", "linux", 1000, "auto", "/run/k3sm/netd.sock", "nftables"},
	} {
		cfg := Config{NetdSocket: tc.netd}
		if got := ServiceProxyMode(tc.mode, tc.goos, cfg.NetdAvailable(tc.euid), tc.podNetwork); got != tc.want {
			t.Errorf("%+v: %s", tc, got)
		}
	}
	cfg := Defaults()
	cfg.ServiceProxy = "ipvs"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "service-proxy") {
		t.Fatalf("--service-proxy=ipvs: %v", err)
	}
	cfg = Defaults()
	cfg.NetdSocket = "run/netd.sock"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "netd-socket") {
		t.Fatalf("--netd-socket relative: %v", err)
	}
}
