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
		want       string
	}{
		{"auto", "linux", 0, "auto", "nftables"},
		{"", "linux", 0, "netns", "nftables"},
		{"auto", "linux", 1000, "auto", "userspace"},
		{"auto", "darwin", 0, "auto", "userspace"},
		{"auto", "linux", 0, "host", "userspace"},
		{"userspace", "linux", 0, "auto", "userspace"},
		{"nftables", "linux", 0, "auto", "nftables"},
	} {
		if got := ServiceProxyMode(tc.mode, tc.goos, tc.euid, tc.podNetwork); got != tc.want {
			t.Errorf("%+v: %s", tc, got)
		}
	}
	cfg := Defaults()
	cfg.ServiceProxy = "ipvs"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "service-proxy") {
		t.Fatalf("--service-proxy=ipvs: %v", err)
	}
}
