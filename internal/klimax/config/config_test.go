package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultsMatchReference(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.VM.Name != "klimax" || c.VM.CPUs != 4 || c.VM.Memory != "10GiB" || c.VM.Disk != "40GiB" || c.VM.Rosetta {
		t.Errorf("vm defaults: %+v", c.VM)
	}
	if c.Network.KindBridgeCIDR != "172.30.0.0/16" || !c.Network.DisablePortMirroring {
		t.Errorf("network defaults: %+v", c.Network)
	}
	if c.Kind.NodeVersion != "v1.35.0" || c.Kind.MetalLBVersion != "v0.16.1" || !c.Kind.AutoMergeKubeconfig || !c.Kind.AutoRemoveKubeconfig {
		t.Errorf("kind defaults: %+v", c.Kind)
	}
	want := map[string]int{"registry-dockerio": 5030, "registry-quayio": 5010, "registry-gcrio": 5020,
		"registry-us-docker-pkgdev": 5040, "registry-us-central1-docker-pkgdev": 5050}
	if len(c.Registries.Mirrors) != 5 || c.Registries.CacheStorage != "host" {
		t.Fatalf("registries: %+v", c.Registries)
	}
	for _, m := range c.Registries.Mirrors {
		if want[m.Name] != m.Port {
			t.Errorf("mirror %s port %d", m.Name, m.Port)
		}
	}
	if got := c.Registries.Mirrors[0].RegistryHost(); got != "docker.io" {
		t.Errorf("docker hub host = %q", got)
	}
	if c.Network.BridgePrefix() != "172.30" || c.Network.BridgeGateway() != "172.30.0.1" {
		t.Errorf("prefix %s gw %s", c.Network.BridgePrefix(), c.Network.BridgeGateway())
	}
}

func TestParsePartialKeepsDefaults(t *testing.T) {
	c, err := Parse([]byte("vm:\n  cpus: 8\nkind:\n  customDnsResolvers:\n  - domain: runlocal.dev\n  - domain: corp.example\n    resolvers: [10.0.0.53, '10.0.0.54:5353']\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.VM.CPUs != 8 || c.VM.Memory != "10GiB" || len(c.Registries.Mirrors) != 5 || !c.Kind.AutoMergeKubeconfig {
		t.Errorf("partial parse lost defaults: %+v", c)
	}
	if !reflect.DeepEqual(c.Kind.CustomDNSResolvers[0].Resolvers, DefaultResolvers) {
		t.Errorf("resolver default not applied: %+v", c.Kind.CustomDNSResolvers[0])
	}
	if len(c.Kind.CustomDNSResolvers[1].Resolvers) != 2 {
		t.Errorf("explicit resolvers: %+v", c.Kind.CustomDNSResolvers[1])
	}
	c, err = Parse([]byte("registries:\n  mirrors: []\n"))
	if err != nil || len(c.Registries.Mirrors) != 0 {
		t.Errorf("explicit empty mirrors: %v %+v", err, c)
	}
	c, err = Parse(nil)
	if err != nil || !reflect.DeepEqual(c, Default()) {
		t.Errorf("empty doc: %v", err)
	}
}

func TestUnknownKeysNamedByPath(t *testing.T) {
	cases := map[string]string{
		"vm:\n  cpu: 4\n": "vm.cpu: unknown key (line 2)",
		"nework: {}\n":    "nework: unknown key (line 1)",
		"registries:\n  mirrors:\n  - name: a\n    prot: 1\n":     "registries.mirrors[0].prot: unknown key (line 4)",
		"kind:\n  customDnsResolvers:\n  - domain: a\n    x: 1\n": "kind.customDnsResolvers[0].x",
	}
	for doc, want := range cases {
		_, err := Parse([]byte(doc))
		var uk *UnknownKeyError
		if !errors.As(err, &uk) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", doc, err, want)
		}
	}
	if _, err := Parse([]byte("vm: {}\n---\nvm: {}\n")); err == nil {
		t.Error("multi-document config accepted")
	}
	if _, err := Parse([]byte("vm:\n  cpus: many\n")); err == nil || !strings.Contains(err.Error(), "many") {
		t.Errorf("type error: %v", err)
	}
}

func TestValidateNamesFieldAndFix(t *testing.T) {
	cases := []struct{ doc, field string }{
		{"vm:\n  name: 'a b;rm'\n", "vm.name"},
		{"vm:\n  driver: qemu\n", "vm.driver"},
		{"vm:\n  cpus: 0\n", "vm.cpus"},
		{"vm:\n  memory: 10G\n", "vm.memory"},
		{"vm:\n  disk: lots\n", "vm.disk"},
		{"network:\n  kindBridgeCIDR: 172.30.0.0/24\n", "network.kindBridgeCIDR"},
		{"network:\n  kindBridgeCIDR: 172.30.1.0/16\n", "network.kindBridgeCIDR"},
		{"network:\n  kindBridgeCIDR: 10.200.0.0/16\n", "network.kindBridgeCIDR"},
		{"kind:\n  nodeVersion: latest\n", "kind.nodeVersion"},
		{"kind:\n  metalLBVersion: main\n", "kind.metalLBVersion"},
		{"kind:\n  nodeImage: klimax/node:v1.37.2\n", "kind.nodeImage"},
		{"kind:\n  nodeImage: Klimax/Node\n", "kind.nodeImage"},
		{"kind:\n  customDnsResolvers:\n  - domain: 'x;reboot'\n", "kind.customDnsResolvers[0].domain"},
		{"kind:\n  customDnsResolvers:\n  - domain: a.dev\n  - domain: a.dev\n", "kind.customDnsResolvers[1].domain"},
		{"kind:\n  customDnsResolvers:\n  - domain: a.dev\n    resolvers: [dns.google]\n", "kind.customDnsResolvers[0].resolvers[0]"},
		{"registries:\n  cacheStorage: s3\n", "registries.cacheStorage"},
		{"registries:\n  mirrors:\n  - {name: A, port: 5000, remoteURL: https://x.io}\n", "registries.mirrors[0].name"},
		{"registries:\n  mirrors:\n  - {name: a, port: 80, remoteURL: https://x.io}\n", "registries.mirrors[0].port"},
		{"registries:\n  mirrors:\n  - {name: a, port: 5000, remoteURL: https://x.io}\n  - {name: b, port: 5000, remoteURL: https://y.io}\n", "registries.mirrors[1].port"},
		{"registries:\n  mirrors:\n  - {name: a, port: 5000, remoteURL: https://x.io}\n  - {name: a, port: 5001, remoteURL: https://y.io}\n", "registries.mirrors[1].name"},
		{"registries:\n  mirrors:\n  - {name: a, port: 5000, remoteURL: ftp://x.io}\n", "registries.mirrors[0].remoteURL"},
		{"registries:\n  mirrors:\n  - {name: a, port: 5000, remoteURL: 'https://x.io/$(id)'}\n", "registries.mirrors[0].remoteURL"},
		{"registries:\n  mirrors:\n  - {name: a, port: 5000, remoteURL: https://x.io, username: u}\n", "registries.mirrors[0]"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.doc))
		var es Errors
		if !errors.As(err, &es) {
			t.Errorf("%q: want validation error, got %v", tc.doc, err)
			continue
		}
		found := false
		for _, e := range es {
			if e.Field == tc.field && e.Fix != "" {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: no error for %s with a fix: %v", tc.doc, tc.field, err)
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "config.yaml")
	c := Default()
	c.VM.CPUs = 6
	c.Kind.CustomDNSResolvers = []DNSResolver{{Domain: "runlocal.dev", Resolvers: []string{"1.1.1.1"}}}
	c.Registries.Mirrors[0].Username, c.Registries.Mirrors[0].Password = "u", "p"
	if err := Save(path, c); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, c)
	}
	missing, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err != nil || !reflect.DeepEqual(missing, Default()) {
		t.Errorf("missing file: %v", err)
	}
	bad := Default()
	bad.VM.CPUs = -1
	if err := Save(path, bad); err == nil {
		t.Error("Save accepted invalid config")
	}
}

func writeEditor(content string) EditFunc {
	return func(ctx context.Context, path string) error { return os.WriteFile(path, []byte(content), 0o600) }
}

func TestEditValidReplacesAtomically(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	c, err := Edit(context.Background(), path, writeEditor("# mine\nvm:\n  cpus: 2\n"), EditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.VM.CPUs != 2 {
		t.Errorf("cpus %d", c.VM.CPUs)
	}
	data, _ := os.ReadFile(path)
	if string(data) != "# mine\nvm:\n  cpus: 2\n" {
		t.Errorf("file not the user's text (comments must survive): %q", data)
	}
	assertNoTemps(t, filepath.Dir(path), 1)
}

func TestEditInvalidKeepsOldFileAndEdits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("vm:\n  cpus: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Edit(context.Background(), path, writeEditor("vm:\n  cpus: 0\n"), EditOptions{})
	if err == nil || !strings.Contains(err.Error(), "vm.cpus") || !strings.Contains(err.Error(), "kept in") {
		t.Fatalf("err = %v", err)
	}
	data, _ := os.ReadFile(path)
	if string(data) != "vm:\n  cpus: 3\n" {
		t.Errorf("original changed: %q", data)
	}
	kept := assertNoTemps(t, dir, 2)
	edited, _ := os.ReadFile(kept)
	if string(edited) != "vm:\n  cpus: 0\n" {
		t.Errorf("edits lost: %q", edited)
	}
}

func TestEditRetryThenSucceed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	n := 0
	ed := func(ctx context.Context, p string) error {
		n++
		if n == 1 {
			return os.WriteFile(p, []byte("vm:\n  bogus: 1\n"), 0o600)
		}
		return os.WriteFile(p, []byte("vm:\n  cpus: 5\n"), 0o600)
	}
	var retried error
	c, err := Edit(context.Background(), path, ed, EditOptions{Retry: func(err error) bool { retried = err; return true }})
	if err != nil || c.VM.CPUs != 5 || n != 2 {
		t.Fatalf("c=%v err=%v n=%d", c, err, n)
	}
	if retried == nil || !strings.Contains(retried.Error(), "vm.bogus") {
		t.Errorf("retry err = %v", retried)
	}
}

func TestEditNoChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	_, err := Edit(context.Background(), path, func(context.Context, string) error { return nil }, EditOptions{})
	if !errors.Is(err, ErrNoChange) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Error("no-change edit created the file")
	}
}

// assertNoTemps checks dir holds exactly want entries and returns the one
// that is not config.yaml, if any.
func assertNoTemps(t *testing.T, dir string, want int) string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	if len(ents) != want {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("dir has %v, want %d entries", names, want)
	}
	for _, e := range ents {
		if e.Name() != "config.yaml" {
			return filepath.Join(dir, e.Name())
		}
	}
	return ""
}

// TestBridgeCIDRSpecialRanges: loopback, link-local, multicast, reserved and
// "this network" ranges cannot carry a bridge and are refused by name.
func TestBridgeCIDRSpecialRanges(t *testing.T) {
	for cidr, want := range map[string]string{"127.0.0.0/16": "loopback", "169.254.0.0/16": "link-local",
		"239.1.0.0/16": "multicast", "250.1.0.0/16": "reserved", "0.0.0.0/16": "this network"} {
		_, err := Parse([]byte("network:\n  kindBridgeCIDR: " + cidr + "\n"))
		if err == nil || !strings.Contains(err.Error(), "network.kindBridgeCIDR") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming network.kindBridgeCIDR and %q", cidr, err, want)
		}
	}
	if _, err := Parse([]byte("network:\n  kindBridgeCIDR: 192.168.0.0/16\n")); err != nil {
		t.Errorf("192.168.0.0/16 refused: %v", err)
	}
}

// TestMirrorImage: registries.mirrorImage is optional, parsed as an image
// reference, and refused by name when it is not one.
func TestMirrorImage(t *testing.T) {
	c, err := Parse([]byte("registries:\n  mirrorImage: localhost:5000/registry:3.0.0\n"))
	if err != nil || c.Registries.MirrorImage != "localhost:5000/registry:3.0.0" {
		t.Fatalf("valid image: %v %+v", err, c)
	}
	if c, err := Parse([]byte("vm:\n  cpus: 2\n")); err != nil || c.Registries.MirrorImage != "" {
		t.Fatalf("default: %v %q", err, c.Registries.MirrorImage)
	}
	_, err = Parse([]byte("registries:\n  mirrorImage: 'Bad Image;rm'\n"))
	if err == nil || !strings.Contains(err.Error(), "registries.mirrorImage") {
		t.Fatalf("bad image: %v", err)
	}
}

// TestIsDNSLabelAndDomain: the label and domain checks klimax's names use
// (the domain cases come from guest.ValidateDomain, which this replaced).
func TestIsDNSLabelAndDomain(t *testing.T) {
	for _, ok := range []string{"a", "klimax", "registry-dockerio", strings.Repeat("a", 40)} {
		if !IsDNSLabel(ok, 40) {
			t.Errorf("label %q refused", ok)
		}
	}
	for _, bad := range []string{"", "A", "-a", "a-", "a_b", "a.b", "a b;rm", strings.Repeat("a", 41)} {
		if IsDNSLabel(bad, 40) {
			t.Errorf("label %q accepted", bad)
		}
	}
	for _, ok := range []string{"runlocal.dev", "a.b.c", "example.com."} {
		if !IsDomain(ok) {
			t.Errorf("domain %q refused", ok)
		}
	}
	for _, bad := range []string{"", "Example.com", "a..b", "-a.com", "a.com;x", "*.a.com", strings.Repeat("a", 64) + ".com"} {
		if IsDomain(bad) {
			t.Errorf("domain %q accepted", bad)
		}
	}
}
