package nodeproc

import "testing"

func TestPodNetworkMode(t *testing.T) {
	for _, tc := range []struct {
		mode, goos string
		euid       int
		external   string
		netns, err bool
	}{
		{"auto", "linux", 0, "", true, false},
		{"auto", "linux", 1000, "", false, false},
		{"netns", "linux", 1000, "", false, true},
		{"host", "linux", 0, "", false, false},
		{"auto", "darwin", 0, "", false, false},
		// A k3sm-netd run apart, as root, serves a server that is not.
		{"auto", "linux", 1000, "/run/k3sm/netd.sock", true, false},
		{"netns", "linux", 1000, "/run/k3sm/netd.sock", true, false},
		{"auto", "darwin", 1000, "/run/k3sm/netd.sock", false, true},
	} {
		netns, reason, err := PodNetworkMode(tc.mode, tc.goos, tc.euid, tc.external)
		if netns != tc.netns || (err != nil) != tc.err || (!netns && err == nil && reason == "") {
			t.Errorf("%+v: netns %v, reason %q, err %v", tc, netns, reason, err)
		}
	}
}
