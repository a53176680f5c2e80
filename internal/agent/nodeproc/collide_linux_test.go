package nodeproc

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRouteCollision runs in a network namespace of its own (the test
// binary re-executed under unshare), where it adds the routes it checks.
func TestRouteCollision(t *testing.T) {
	if os.Getenv("K3SM_COLLIDE_CHILD") == "" {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a network namespace")
		}
		cmd := exec.Command("unshare", "--net", os.Args[0], "-test.run", "^TestRouteCollision$", "-test.v")
		cmd.Env = append(os.Environ(), "K3SM_COLLIDE_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in a new network namespace: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS: TestRouteCollision") {
			t.Fatalf("child did not run the test:\n%s", out)
		}
		return
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	run("link", "set", "lo", "up")
	run("link", "add", "d0", "type", "veth", "peer", "name", "d0p")
	run("addr", "add", "192.0.2.1/24", "dev", "d0")
	run("link", "set", "d0", "up")
	// A default route overlaps every range but is no collision (netlink
	// may report it as 0.0.0.0/0).
	run("route", "add", "default", "via", "192.0.2.254", "dev", "d0")
	ranges := map[string]netip.Prefix{"cluster-cidr": netip.MustParsePrefix("100.64.0.0/10"), "service-cidr": netip.MustParsePrefix("10.43.0.0/16")}
	if err := RouteCollision(ranges, "k3sm0"); err != nil {
		t.Fatalf("no overlapping route, yet: %v", err)
	}
	// The pod network's own routes are not a collision.
	run("link", "add", "k3sm0", "type", "bridge")
	run("addr", "add", "100.64.0.1/24", "dev", "k3sm0")
	run("link", "set", "k3sm0", "up")
	run("route", "add", "unreachable", "100.64.0.0/10")
	run("route", "add", "local", "10.43.0.0/16", "dev", "lo", "table", "local", "proto", "static")
	if err := RouteCollision(ranges, "k3sm0"); err != nil {
		t.Fatalf("k3sm's own routes reported: %v", err)
	}
	// A VPN's 100.64.0.0/10 route (Tailscale's range) is.
	run("link", "add", "tun9", "type", "veth", "peer", "name", "tun9p")
	run("link", "set", "tun9", "up")
	run("route", "add", "100.100.0.0/16", "dev", "tun9")
	err := RouteCollision(ranges, "k3sm0")
	if err == nil || !strings.Contains(err.Error(), "--cluster-cidr 100.64.0.0/10 overlaps") || !strings.Contains(err.Error(), "dev tun9") {
		t.Fatalf("overlapping route: %v", err)
	}
}
