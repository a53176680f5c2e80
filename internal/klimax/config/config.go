// Package config owns klimax's user configuration file (~/.klimax/config.yaml):
// its schema and defaults, strict parsing, validation with actionable errors,
// atomic saving and the `config edit` workflow.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Driver names.
const (
	DriverLima = "lima"
	DriverHost = "host"
)

// Registry cache storage locations.
const (
	CacheHost  = "host"
	CacheGuest = "guest"
)

// DefaultResolvers are used for a customDnsResolvers entry that lists none.
var DefaultResolvers = []string{"8.8.8.8", "8.8.4.4"}

// Config is the whole ~/.klimax/config.yaml document.
type Config struct {
	VM         VMConfig         `yaml:"vm" json:"vm"`
	Network    NetworkConfig    `yaml:"network" json:"network"`
	Kind       KindConfig       `yaml:"kind" json:"kind"`
	Registries RegistriesConfig `yaml:"registries" json:"registries"`
}

// VMConfig describes the single VM (or, with driver host, the local host).
type VMConfig struct {
	Name    string `yaml:"name" json:"name"`
	Driver  string `yaml:"driver" json:"driver"`
	CPUs    int    `yaml:"cpus" json:"cpus"`
	Memory  string `yaml:"memory" json:"memory"`
	Disk    string `yaml:"disk" json:"disk"`
	Rosetta bool   `yaml:"rosetta" json:"rosetta"`
}

// NetworkConfig describes the shared kind bridge network.
type NetworkConfig struct {
	KindBridgeCIDR       string `yaml:"kindBridgeCIDR" json:"kindBridgeCIDR"`
	DisablePortMirroring bool   `yaml:"disablePortMirroring" json:"disablePortMirroring"`
}

// KindConfig holds per-cluster defaults.
type KindConfig struct {
	NodeVersion string `yaml:"nodeVersion" json:"nodeVersion"`
	// NodeImage is the repository of kind node images; a cluster runs
	// <nodeImage>:<nodeVersion>. Empty: klimax/node (built offline by
	// `klimax node-image build`) when the engine has that tag, else
	// kindest/node (pulled by kind).
	NodeImage            string        `yaml:"nodeImage,omitempty" json:"nodeImage,omitempty"`
	MetalLBVersion       string        `yaml:"metalLBVersion" json:"metalLBVersion"`
	CustomDNSResolvers   []DNSResolver `yaml:"customDnsResolvers" json:"customDnsResolvers"`
	AutoMergeKubeconfig  bool          `yaml:"autoMergeKubeconfig" json:"autoMergeKubeconfig"`
	AutoRemoveKubeconfig bool          `yaml:"autoRemoveKubeconfig" json:"autoRemoveKubeconfig"`
}

// DNSResolver forwards one DNS domain to specific upstream resolvers (CoreDNS).
type DNSResolver struct {
	Domain    string   `yaml:"domain" json:"domain"`
	Resolvers []string `yaml:"resolvers,omitempty" json:"resolvers,omitempty"`
}

// RegistriesConfig holds the pull-through registry mirrors.
type RegistriesConfig struct {
	CacheStorage string `yaml:"cacheStorage" json:"cacheStorage"`
	// MirrorImage is the registry image the mirrors run in proxy mode;
	// empty means the pinned default (docker.DefaultMirrorImage). Set it
	// to an image the engine already has where the default cannot be
	// pulled (an air-gapped machine).
	MirrorImage string   `yaml:"mirrorImage,omitempty" json:"mirrorImage,omitempty"`
	Mirrors     []Mirror `yaml:"mirrors" json:"mirrors"`
}

// Mirror is one pull-through registry container on the kind network. It is
// reachable from kind nodes as http://<Name>:<Port>, so the registry inside
// the container must listen on Port.
type Mirror struct {
	Name      string `yaml:"name" json:"name"`
	Port      int    `yaml:"port" json:"port"`
	RemoteURL string `yaml:"remoteURL" json:"remoteURL"`
	Username  string `yaml:"username,omitempty" json:"username,omitempty"`
	Password  string `yaml:"password,omitempty" json:"password,omitempty"`
}

// Endpoint is the mirror's URL as seen from containers on the kind network.
func (m Mirror) Endpoint() string { return fmt.Sprintf("http://%s:%d", m.Name, m.Port) }

// RegistryHost is the registry name images are pulled by (the containerd
// certs.d directory): docker.io for Docker Hub, otherwise the remote host.
func (m Mirror) RegistryHost() string {
	u, err := url.Parse(m.RemoteURL)
	if err != nil || u.Host == "" {
		return ""
	}
	switch u.Host {
	case "registry-1.docker.io", "index.docker.io", "registry.hub.docker.com":
		return "docker.io"
	}
	return u.Host
}

// DefaultDriver is lima on macOS and host elsewhere.
func DefaultDriver() string {
	if runtime.GOOS == "darwin" {
		return DriverLima
	}
	return DriverHost
}

// DefaultMirrors returns the five default pull-through mirrors.
func DefaultMirrors() []Mirror {
	return []Mirror{
		{Name: "registry-dockerio", Port: 5030, RemoteURL: "https://registry-1.docker.io"},
		{Name: "registry-quayio", Port: 5010, RemoteURL: "https://quay.io"},
		{Name: "registry-gcrio", Port: 5020, RemoteURL: "https://gcr.io"},
		{Name: "registry-us-docker-pkgdev", Port: 5040, RemoteURL: "https://us-docker.pkg.dev"},
		{Name: "registry-us-central1-docker-pkgdev", Port: 5050, RemoteURL: "https://us-central1-docker.pkg.dev"},
	}
}

// Default returns the configuration used when no file exists.
func Default() *Config {
	return &Config{
		VM: VMConfig{Name: "klimax", Driver: DefaultDriver(), CPUs: 4, Memory: "10GiB", Disk: "40GiB"},
		Network: NetworkConfig{
			KindBridgeCIDR:       "172.30.0.0/16",
			DisablePortMirroring: true,
		},
		Kind: KindConfig{
			NodeVersion:          "v1.35.0",
			MetalLBVersion:       "v0.16.1",
			CustomDNSResolvers:   []DNSResolver{},
			AutoMergeKubeconfig:  true,
			AutoRemoveKubeconfig: true,
		},
		Registries: RegistriesConfig{CacheStorage: CacheHost, Mirrors: DefaultMirrors()},
	}
}

// Home is klimax's state directory (~/.klimax).
func Home() string {
	if h := os.Getenv("KLIMAX_HOME"); h != "" {
		return h
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "."
	}
	return filepath.Join(home, ".klimax")
}

// Load reads path strictly and validates it. A missing file yields Default().
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Default(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a config document on top of the defaults (keys left out keep
// their default), rejects unknown keys and validates the result.
func Parse(data []byte) (*Config, error) {
	c := Default()
	if err := StrictUnmarshal(data, c); err != nil {
		return nil, err
	}
	c.normalize()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) normalize() {
	for i := range c.Kind.CustomDNSResolvers {
		if len(c.Kind.CustomDNSResolvers[i].Resolvers) == 0 {
			c.Kind.CustomDNSResolvers[i].Resolvers = append([]string(nil), DefaultResolvers...)
		}
	}
	if c.VM.Driver == "" {
		c.VM.Driver = DefaultDriver()
	}
}

// FieldError names the offending config key and how to fix it.
type FieldError struct {
	Field string // dotted path, e.g. registries.mirrors[2].port
	Msg   string
	Fix   string
}

func (e *FieldError) Error() string {
	s := e.Field + ": " + e.Msg
	if e.Fix != "" {
		s += " (fix: " + e.Fix + ")"
	}
	return s
}

// Errors collects several FieldErrors.
type Errors []*FieldError

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return "invalid config:\n  " + strings.Join(parts, "\n  ")
}

var (
	sizeRe    = regexp.MustCompile(`^[1-9][0-9]*(MiB|GiB|TiB)$`)
	versionRe = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)
	// nodeImageRe is an image repository: an optional registry host[:port],
	// lower-case path components, no tag or digest.
	nodeImageRe = regexp.MustCompile(`^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
)

// IsDNSLabel reports whether s is an RFC 1123 label of at most max characters
// (lower-case alphanumerics and '-'): safe in file names, URLs and shells.
func IsDNSLabel(s string, max int) bool {
	return len(s) <= max && len(validation.IsDNS1123Label(s)) == 0
}

// IsDomain reports whether s is a DNS domain made of RFC 1123 labels (a
// trailing dot allowed). Label by label: validation.IsDNS1123Subdomain does
// not bound each label at 63 characters.
func IsDomain(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !IsDNSLabel(l, validation.DNS1123LabelMaxLength) {
			return false
		}
	}
	return true
}

// Validate checks every field and returns all problems at once.
func (c *Config) Validate() error {
	var es Errors
	add := func(field, msg, fix string) { es = append(es, &FieldError{Field: field, Msg: msg, Fix: fix}) }

	if !IsDNSLabel(c.VM.Name, 40) {
		add("vm.name", fmt.Sprintf("%q is not a valid VM name", c.VM.Name), "use 1-40 lower-case letters, digits and '-', e.g. klimax")
	}
	if c.VM.Driver != DriverLima && c.VM.Driver != DriverHost {
		add("vm.driver", fmt.Sprintf("unknown driver %q", c.VM.Driver), "set vm.driver to lima (macOS VM) or host (Linux, local Docker)")
	}
	if c.VM.CPUs < 1 || c.VM.CPUs > 256 {
		add("vm.cpus", fmt.Sprintf("%d is out of range", c.VM.CPUs), "set vm.cpus between 1 and 256, e.g. 4")
	}
	if !sizeRe.MatchString(c.VM.Memory) {
		add("vm.memory", fmt.Sprintf("%q is not a size", c.VM.Memory), "use an integer with MiB/GiB/TiB, e.g. 10GiB")
	}
	if !sizeRe.MatchString(c.VM.Disk) {
		add("vm.disk", fmt.Sprintf("%q is not a size", c.VM.Disk), "use an integer with MiB/GiB/TiB, e.g. 40GiB")
	}

	if p, err := netip.ParsePrefix(c.Network.KindBridgeCIDR); err != nil || !p.Addr().Is4() || p.Bits() != 16 || p.Masked() != p {
		add("network.kindBridgeCIDR", fmt.Sprintf("%q is not an IPv4 /16 network", c.Network.KindBridgeCIDR),
			"use a /16 network address such as 172.30.0.0/16 (each cluster gets <a.b>.N.0/24 for MetalLB)")
	} else if p.Overlaps(netip.MustParsePrefix("10.0.0.0/8")) {
		add("network.kindBridgeCIDR", fmt.Sprintf("%s overlaps 10.0.0.0/8, used by cluster service and pod subnets", p),
			"choose a range outside 10.0.0.0/8, e.g. 172.30.0.0/16")
	} else if kind := specialRange(p); kind != "" {
		add("network.kindBridgeCIDR", fmt.Sprintf("%s is %s, which a bridge network cannot use", p, kind),
			"choose a private range such as 172.30.0.0/16 or 192.168.0.0/16")
	}

	if !versionRe.MatchString(c.Kind.NodeVersion) {
		add("kind.nodeVersion", fmt.Sprintf("%q is not a version", c.Kind.NodeVersion), "use a kindest/node tag like v1.35.0")
	}
	if img := c.Kind.NodeImage; img != "" && !nodeImageRe.MatchString(img) {
		add("kind.nodeImage", fmt.Sprintf("%q is not an image repository", img), "use a repository without a tag, like klimax/node or kindest/node (the tag is kind.nodeVersion), or leave it empty")
	}
	if !versionRe.MatchString(c.Kind.MetalLBVersion) {
		add("kind.metalLBVersion", fmt.Sprintf("%q is not a version", c.Kind.MetalLBVersion), "use a MetalLB release tag like v0.16.1")
	}
	seenDomain := map[string]bool{}
	for i, r := range c.Kind.CustomDNSResolvers {
		f := fmt.Sprintf("kind.customDnsResolvers[%d]", i)
		if !IsDomain(r.Domain) {
			add(f+".domain", fmt.Sprintf("%q is not a DNS domain", r.Domain), "use a lower-case domain like runlocal.dev")
		} else if seenDomain[r.Domain] {
			add(f+".domain", fmt.Sprintf("domain %q is listed twice", r.Domain), "merge the resolvers into one entry")
		}
		seenDomain[r.Domain] = true
		for j, s := range r.Resolvers {
			if !validResolver(s) {
				add(fmt.Sprintf("%s.resolvers[%d]", f, j), fmt.Sprintf("%q is not an IP address or IP:port", s), "use e.g. 8.8.8.8 or 10.0.0.53:53")
			}
		}
	}

	if c.Registries.CacheStorage != CacheHost && c.Registries.CacheStorage != CacheGuest {
		add("registries.cacheStorage", fmt.Sprintf("unknown value %q", c.Registries.CacheStorage), "set it to host (cache survives VM destroy) or guest")
	}
	if img := c.Registries.MirrorImage; img != "" {
		if _, err := name.ParseReference(img); err != nil {
			add("registries.mirrorImage", fmt.Sprintf("%q is not an image reference: %v", img, err), "use e.g. registry:3.0.0 or localhost:5000/registry:3.0.0, or leave it empty for the default")
		}
	}
	names, ports, hosts := map[string]int{}, map[int]int{}, map[string]int{}
	for i, m := range c.Registries.Mirrors {
		f := fmt.Sprintf("registries.mirrors[%d]", i)
		if !IsDNSLabel(m.Name, 63) {
			add(f+".name", fmt.Sprintf("%q is not a valid container name", m.Name), "use lower-case letters, digits and '-', e.g. registry-dockerio")
		} else if j, ok := names[m.Name]; ok {
			add(f+".name", fmt.Sprintf("%q is already used by registries.mirrors[%d]", m.Name, j), "give each mirror a unique name")
		} else {
			names[m.Name] = i
		}
		if m.Port < 1024 || m.Port > 65535 {
			add(f+".port", fmt.Sprintf("%d is out of range", m.Port), "use a port between 1024 and 65535, e.g. 5030")
		} else if j, ok := ports[m.Port]; ok {
			add(f+".port", fmt.Sprintf("port %d is already used by registries.mirrors[%d]", m.Port, j), "give each mirror a unique port")
		} else {
			ports[m.Port] = i
		}
		u, err := url.Parse(m.RemoteURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || strings.ContainsAny(m.RemoteURL, " \t\n'\"`$\\;") {
			add(f+".remoteURL", fmt.Sprintf("%q is not an http(s) registry URL", m.RemoteURL), "use e.g. https://registry-1.docker.io (credentials go in username/password)")
		} else if j, ok := hosts[m.RegistryHost()]; ok {
			add(f+".remoteURL", fmt.Sprintf("registry %s is already mirrored by registries.mirrors[%d]", m.RegistryHost(), j), "keep one mirror per remote registry")
		} else {
			hosts[m.RegistryHost()] = i
		}
		if (m.Username == "") != (m.Password == "") {
			add(f, "username and password must be set together", "set both username and password, or neither")
		}
	}
	if len(es) == 0 {
		return nil
	}
	return es
}

func validResolver(s string) bool {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return true
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p > 0 && p < 65536
}

// BridgePrefix returns the first two octets of the kind bridge CIDR, e.g.
// "172.30" for 172.30.0.0/16. Call only on a validated config.
func (n NetworkConfig) BridgePrefix() string {
	p := netip.MustParsePrefix(n.KindBridgeCIDR).Addr().As4()
	return fmt.Sprintf("%d.%d", p[0], p[1])
}

// BridgeGateway is the .1 address of the kind bridge (Docker network gateway).
func (n NetworkConfig) BridgeGateway() string { return n.BridgePrefix() + ".0.1" }

// DockerSocketPath is where the VM's Docker socket appears on the host
// (~/.<vm>.docker.sock) for the lima driver.
func (c *Config) DockerSocketPath() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, "."+c.VM.Name+".docker.sock")
}

// MirrorNames lists the configured mirror names.
func (c *Config) MirrorNames() []string {
	out := make([]string, 0, len(c.Registries.Mirrors))
	for _, m := range c.Registries.Mirrors {
		out = append(out, m.Name)
	}
	return out
}

// specialRange names the kind of IPv4 range p falls in when it cannot carry
// a routed bridge (loopback, link-local, multicast, reserved, "this
// network"), or "" when it can.
func specialRange(p netip.Prefix) string {
	for _, r := range []struct{ cidr, kind string }{
		{"0.0.0.0/8", "\"this network\" (0.0.0.0/8)"},
		{"127.0.0.0/8", "loopback (127.0.0.0/8)"},
		{"169.254.0.0/16", "link-local (169.254.0.0/16)"},
		{"224.0.0.0/4", "multicast (224.0.0.0/4)"},
		{"240.0.0.0/4", "reserved (240.0.0.0/4)"},
	} {
		if p.Overlaps(netip.MustParsePrefix(r.cidr)) {
			return r.kind
		}
	}
	return ""
}
