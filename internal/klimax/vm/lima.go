package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/k3sm-dev/k3sm/internal/units"
)

// LimaSpec is everything the lima driver needs to render the instance.
type LimaSpec struct {
	Name    string // instance name (validated DNS label)
	CPUs    int
	Memory  string // e.g. 10GiB
	Disk    string // e.g. 40GiB
	Rosetta bool
	// DisablePortMirroring adds ignore-all TCP port-forward rules so Lima
	// does not mirror every guest port onto the host (clusters are reached
	// through the routed bridge instead).
	DisablePortMirroring bool
	// DockerSocket is the host path the guest Docker socket is forwarded to
	// (~/.<vm>.docker.sock).
	DockerSocket string
	// CacheDir, when set, is a host directory mounted writable at the same
	// path in the guest (registry cache with cacheStorage: host).
	CacheDir string
	// ProvisionScript is run by Lima as root at every boot (idempotent).
	ProvisionScript string
	// Images overrides the default Ubuntu cloud images.
	Images []LimaImage
}

// LimaImage is one entry of Lima's images list.
type LimaImage struct {
	Location string `yaml:"location"`
	Arch     string `yaml:"arch"`
	Digest   string `yaml:"digest,omitempty"`
}

// DefaultLimaImages are Ubuntu 24.04 LTS cloud images (the distro's signed
// release channel; Lima verifies the download when a digest is given).
var DefaultLimaImages = []LimaImage{
	{Location: "https://cloud-images.ubuntu.com/releases/24.04/release/ubuntu-24.04-server-cloudimg-arm64.img", Arch: "aarch64"},
	{Location: "https://cloud-images.ubuntu.com/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img", Arch: "x86_64"},
}

// limaConfig mirrors the subset of Lima's instance YAML that klimax sets.
type limaConfig struct {
	VMType       string            `yaml:"vmType"`
	Rosetta      *limaRosetta      `yaml:"rosetta,omitempty"`
	Images       []LimaImage       `yaml:"images"`
	CPUs         int               `yaml:"cpus"`
	Memory       string            `yaml:"memory"`
	Disk         string            `yaml:"disk"`
	MountType    string            `yaml:"mountType"`
	Mounts       []limaMount       `yaml:"mounts"`
	Networks     []limaNetwork     `yaml:"networks"`
	Containerd   limaContainerd    `yaml:"containerd"`
	PortForwards []limaPortForward `yaml:"portForwards"`
	Provision    []limaProvision   `yaml:"provision,omitempty"`
}

type limaRosetta struct {
	Enabled bool `yaml:"enabled"`
	BinFmt  bool `yaml:"binfmt"`
}

type limaMount struct {
	Location   string `yaml:"location"`
	MountPoint string `yaml:"mountPoint"`
	Writable   bool   `yaml:"writable"`
}

type limaNetwork struct {
	VZNAT bool `yaml:"vzNAT"`
}

type limaContainerd struct {
	System bool `yaml:"system"`
	User   bool `yaml:"user"`
}

type limaPortForward struct {
	GuestSocket    string `yaml:"guestSocket,omitempty"`
	HostSocket     string `yaml:"hostSocket,omitempty"`
	GuestIP        string `yaml:"guestIP,omitempty"`
	GuestPortRange []int  `yaml:"guestPortRange,flow,omitempty"`
	Proto          string `yaml:"proto,omitempty"`
	Ignore         bool   `yaml:"ignore,omitempty"`
}

type limaProvision struct {
	Mode   string `yaml:"mode"`
	Script string `yaml:"script"`
}

// RenderLimaYAML renders the Lima instance definition for spec.
func RenderLimaYAML(spec LimaSpec) ([]byte, error) {
	if spec.Name == "" || spec.CPUs < 1 || spec.Memory == "" || spec.Disk == "" || spec.DockerSocket == "" {
		return nil, fmt.Errorf("lima spec incomplete: name, cpus, memory, disk and docker socket are required")
	}
	if !filepath.IsAbs(spec.DockerSocket) || (spec.CacheDir != "" && !filepath.IsAbs(spec.CacheDir)) {
		return nil, fmt.Errorf("lima spec: docker socket and cache dir must be absolute paths")
	}
	images := spec.Images
	if len(images) == 0 {
		images = DefaultLimaImages
	}
	c := limaConfig{
		VMType:     "vz",
		Images:     images,
		CPUs:       spec.CPUs,
		Memory:     spec.Memory,
		Disk:       spec.Disk,
		MountType:  "virtiofs",
		Mounts:     []limaMount{},
		Networks:   []limaNetwork{{VZNAT: true}},
		Containerd: limaContainerd{System: false, User: false},
		PortForwards: []limaPortForward{
			{GuestSocket: "/var/run/docker.sock", HostSocket: spec.DockerSocket},
		},
	}
	if spec.Rosetta {
		c.Rosetta = &limaRosetta{Enabled: true, BinFmt: true}
	}
	if spec.CacheDir != "" {
		c.Mounts = append(c.Mounts, limaMount{Location: spec.CacheDir, MountPoint: spec.CacheDir, Writable: true})
	}
	if spec.DisablePortMirroring {
		// Rules are matched in order: the socket forward above wins, then
		// every TCP port on any guest address is ignored.
		for _, ip := range []string{"127.0.0.1", "0.0.0.0"} {
			c.PortForwards = append(c.PortForwards, limaPortForward{GuestIP: ip, GuestPortRange: []int{1, 65535}, Proto: "tcp", Ignore: true})
		}
	}
	if spec.ProvisionScript != "" {
		c.Provision = []limaProvision{{Mode: "system", Script: spec.ProvisionScript}}
	}
	var buf bytes.Buffer
	buf.WriteString("# Generated by klimax; changes are overwritten on the next create.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Lima drives one Lima instance through the limactl CLI.
type Lima struct {
	Spec LimaSpec
	// Limactl is the limactl binary (default "limactl", looked up on PATH).
	Limactl string
	// StateDir holds the rendered instance YAML (~/.klimax/lima).
	StateDir string
	// LogLevel, when set, is passed as limactl --log-level.
	LogLevel string
	// Logs, when set, receives limactl's output during create/start
	// (--show-vm-logs).
	Logs io.Writer
	// LifecycleTimeout bounds create/start/stop/delete (default 20m).
	LifecycleTimeout time.Duration
}

// NewLima returns a lima driver for spec.
func NewLima(spec LimaSpec, stateDir string) *Lima {
	return &Lima{Spec: spec, Limactl: "limactl", StateDir: stateDir}
}

func (l *Lima) Name() string       { return "lima" }
func (l *Lima) NeedsRoute() bool   { return true }
func (l *Lima) DockerHost() string { return "unix://" + l.Spec.DockerSocket }

func (l *Lima) limactl(args ...string) []string {
	bin := l.Limactl
	if bin == "" {
		bin = "limactl"
	}
	argv := []string{bin}
	if l.LogLevel != "" {
		argv = append(argv, "--log-level="+l.LogLevel)
	}
	return append(argv, args...)
}

func (l *Lima) lifecycle(ctx context.Context, args ...string) error {
	t := l.LifecycleTimeout
	if t == 0 {
		t = 20 * time.Minute
	}
	_, err := execCommand(ctx, l.limactl(args...), nil, RunOptions{Timeout: t, Stdout: l.Logs, Stderr: l.Logs})
	return err
}

// limaInstance is the part of `limactl list --json` that klimax reads.
type limaInstance struct {
	Name   string   `json:"name"`
	Status string   `json:"status"`
	Dir    string   `json:"dir"`
	VMType string   `json:"vmType"`
	Arch   string   `json:"arch"`
	CPUs   int      `json:"cpus"`
	Memory int64    `json:"memory"`
	Disk   int64    `json:"disk"`
	Errors []string `json:"errors"`
}

// parseLimaList reads limactl list --json output (one JSON object per line,
// or a JSON array) and returns the instance called name, if any.
func parseLimaList(out []byte, name string) (*limaInstance, error) {
	out = bytes.TrimSpace(out)
	var all []limaInstance
	if bytes.HasPrefix(out, []byte("[")) {
		if err := json.Unmarshal(out, &all); err != nil {
			return nil, fmt.Errorf("parse limactl list: %w", err)
		}
	} else {
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var in limaInstance
			if err := dec.Decode(&in); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("parse limactl list: %w", err)
			}
			all = append(all, in)
		}
	}
	for i := range all {
		if all[i].Name == name {
			return &all[i], nil
		}
	}
	return nil, nil
}

func (l *Lima) instance(ctx context.Context) (*limaInstance, error) {
	res, err := execCommand(ctx, l.limactl("list", "--json"), nil, RunOptions{Timeout: time.Minute})
	if err != nil {
		return nil, err
	}
	return parseLimaList(res.Stdout, l.Spec.Name)
}

// Status reads the instance from limactl list.
func (l *Lima) Status(ctx context.Context) (State, error) {
	st := State{Name: l.Spec.Name, Driver: "lima", Phase: PhaseAbsent}
	in, err := l.instance(ctx)
	if err != nil || in == nil {
		return st, err
	}
	switch in.Status {
	case "Running":
		st.Phase = PhaseRunning
	case "Stopped":
		st.Phase = PhaseStopped
	default:
		st.Phase = PhaseBroken
	}
	st.Detail = fmt.Sprintf("%s %s, %d CPUs, %s memory, dir %s", in.VMType, in.Arch, in.CPUs, units.Bytes(in.Memory), in.Dir)
	if len(in.Errors) > 0 {
		st.Detail += "; errors: " + strings.Join(in.Errors, "; ")
	}
	return st, nil
}

// YAMLPath is where the rendered instance definition is written.
func (l *Lima) YAMLPath() string { return filepath.Join(l.StateDir, l.Spec.Name+".yaml") }

// Ensure creates the instance from the rendered YAML if absent, starts it if
// stopped, and does nothing (one `limactl list`) when it already runs.
func (l *Lima) Ensure(ctx context.Context) (bool, error) {
	st, err := l.Status(ctx)
	if err != nil {
		return false, err
	}
	switch st.Phase {
	case PhaseRunning:
		return false, nil
	case PhaseBroken:
		return false, fmt.Errorf("lima instance %q is broken (%s); fix: `klimax destroy` then `klimax up`, or inspect with `limactl list`", l.Spec.Name, st.Detail)
	case PhaseAbsent:
		data, err := RenderLimaYAML(l.Spec)
		if err != nil {
			return false, err
		}
		if err := os.MkdirAll(l.StateDir, 0o700); err != nil {
			return false, err
		}
		if err := os.WriteFile(l.YAMLPath(), data, 0o600); err != nil {
			return false, err
		}
		if err := l.lifecycle(ctx, "create", "--name="+l.Spec.Name, "--tty=false", l.YAMLPath()); err != nil {
			return false, fmt.Errorf("create lima instance: %w", err)
		}
	}
	if err := l.Start(ctx); err != nil {
		return true, err
	}
	return true, nil
}

// Start boots the instance (Lima waits for provisioning to finish).
func (l *Lima) Start(ctx context.Context) error {
	if err := l.lifecycle(ctx, "start", "--tty=false", l.Spec.Name); err != nil {
		return fmt.Errorf("start lima instance: %w", err)
	}
	return nil
}

// Stop stops the instance if it runs.
func (l *Lima) Stop(ctx context.Context) error {
	st, err := l.Status(ctx)
	if err != nil {
		return err
	}
	if st.Phase != PhaseRunning {
		return nil
	}
	if err := l.lifecycle(ctx, "stop", l.Spec.Name); err != nil {
		return fmt.Errorf("stop lima instance: %w", err)
	}
	return nil
}

// Delete removes the instance (and its disk) if it exists.
func (l *Lima) Delete(ctx context.Context) error {
	st, err := l.Status(ctx)
	if err != nil {
		return err
	}
	if st.Phase != PhaseAbsent {
		if err := l.lifecycle(ctx, "delete", "--force", l.Spec.Name); err != nil {
			return fmt.Errorf("delete lima instance: %w", err)
		}
	}
	if err := os.Remove(l.YAMLPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (l *Lima) shellArgv(argv []string, root bool) []string {
	args := []string{"shell", "--workdir=/", l.Spec.Name}
	if root {
		args = append(args, "sudo", "-n", "--")
	}
	return l.limactl(append(args, argv...)...)
}

// Run runs argv in the guest through `limactl shell` (which quotes each
// argument for the guest shell). Scripts should be passed on Stdin to
// `bash -s` rather than as arguments.
func (l *Lima) Run(ctx context.Context, argv []string, opts RunOptions) (Result, error) {
	if len(argv) == 0 {
		return Result{}, errors.New("empty command")
	}
	return execCommand(ctx, l.shellArgv(argv, opts.Root), nil, opts)
}

// Shell opens an interactive shell in the guest, or runs args there.
func (l *Lima) Shell(ctx context.Context, args []string, tio IO) error {
	return interactive(ctx, l.shellArgv(args, false), tio)
}

// HostAddress reads the lima0 (vzNAT) IPv4 address from the guest.
func (l *Lima) HostAddress(ctx context.Context) (netip.Addr, error) {
	res, err := l.Run(ctx, []string{"ip", "-4", "-j", "addr", "show", "dev", "lima0"}, RunOptions{Timeout: 30 * time.Second})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read lima0 address: %w", err)
	}
	p, err := ParseIfacePrefix(res.Stdout, "lima0")
	return p.Addr(), err
}

// ParseIfacePrefix extracts the first global IPv4 address of dev, with its
// prefix length, from `ip -4 -j addr show` output.
func ParseIfacePrefix(out []byte, dev string) (netip.Prefix, error) {
	var links []struct {
		IfName   string `json:"ifname"`
		AddrInfo []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Scope  string `json:"scope"`
			Len    int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &links); err != nil {
		return netip.Prefix{}, fmt.Errorf("parse ip addr output: %w", err)
	}
	for _, l := range links {
		if l.IfName != dev {
			continue
		}
		for _, a := range l.AddrInfo {
			if a.Family != "inet" || (a.Scope != "" && a.Scope != "global") {
				continue
			}
			addr, err := netip.ParseAddr(a.Local)
			if err == nil && addr.Is4() && a.Len > 0 && a.Len <= 32 {
				return netip.PrefixFrom(addr, a.Len), nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("interface %s has no IPv4 address (is the vzNAT network up?)", dev)
}
