package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// DefaultMirrorImage is the registry image run in proxy mode: CNCF
// distribution, configured through its REGISTRY_* environment variables.
// Pinned to a release tag; override with MirrorSpec.Image.
const DefaultMirrorImage = "docker.io/library/registry:3.0.0"

// registryDataDir is where the registry image keeps its storage.
const registryDataDir = "/var/lib/registry"

// MirrorSpec is one pull-through mirror container.
type MirrorSpec struct {
	Name      string // container name and DNS name on the network
	Port      int    // the registry listens on this port inside the container
	RemoteURL string // upstream registry
	Username  string // optional upstream credentials
	Password  string
	Image     string // registry image (DefaultMirrorImage when empty)
	Network   string // network the container joins (alias Name)
	// CacheDir is the directory on the engine's machine bind-mounted as the
	// registry storage; it survives container re-creation.
	CacheDir string
	// PublishIP, when valid, publishes Port on that address of the engine's
	// machine (127.0.0.1: reachable from the machine itself only).
	PublishIP netip.Addr
}

func (s MirrorSpec) image() string {
	if s.Image == "" {
		return DefaultMirrorImage
	}
	return s.Image
}

func (s MirrorSpec) env() []string {
	env := []string{
		"REGISTRY_HTTP_ADDR=0.0.0.0:" + strconv.Itoa(s.Port),
		"REGISTRY_PROXY_REMOTEURL=" + s.RemoteURL,
		"REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY=" + registryDataDir,
		"REGISTRY_STORAGE_DELETE_ENABLED=true",
	}
	if s.Username != "" {
		env = append(env, "REGISTRY_PROXY_USERNAME="+s.Username, "REGISTRY_PROXY_PASSWORD="+s.Password)
	}
	return env
}

// Hash identifies the container configuration; a change re-creates the
// container (the cache directory is kept). Credentials are hashed, never
// stored in a label.
func (s MirrorSpec) Hash() string {
	data, _ := json.Marshal(struct {
		Image, Network, CacheDir, Publish string
		Env                               []string
	}{s.image(), s.Network, s.CacheDir, s.publish(), s.env()})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func (s MirrorSpec) publish() string {
	if !s.PublishIP.IsValid() {
		return ""
	}
	return s.PublishIP.String() + ":" + strconv.Itoa(s.Port)
}

// MirrorState is what klimax reads back about a mirror container.
type MirrorState struct {
	Name    string `json:"name"`
	Exists  bool   `json:"exists"`
	Running bool   `json:"running"`
	Current bool   `json:"current"` // configuration matches the spec
	Image   string `json:"image,omitempty"`
	Status  string `json:"status,omitempty"`
}

// MirrorState inspects the mirror container for spec.
func (c *Client) MirrorState(ctx context.Context, spec MirrorSpec) (MirrorState, error) {
	st := MirrorState{Name: spec.Name}
	res, err := c.api.ContainerInspect(ctx, spec.Name, client.ContainerInspectOptions{})
	if isNotFound(err) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("inspect mirror %s: %w", spec.Name, err)
	}
	ct := res.Container
	st.Exists = true
	if ct.Config != nil {
		st.Image = ct.Config.Image
		if ct.Config.Labels[LabelManagedBy] != ManagedBy {
			return st, fmt.Errorf("container %q exists but was not created by klimax (fix: rename or remove it, or rename the mirror in ~/.klimax/config.yaml)", spec.Name)
		}
		st.Current = ct.Config.Labels[LabelSpecHash] == spec.Hash()
	}
	if ct.State != nil {
		st.Running = ct.State.Running
		st.Status = string(ct.State.Status)
	}
	return st, nil
}

// EnsureMirror makes the mirror container exist with spec's configuration
// and run. A container with an outdated configuration is re-created; the
// cache directory is kept. It reports whether it changed anything.
func (c *Client) EnsureMirror(ctx context.Context, spec MirrorSpec) (bool, error) {
	if spec.Name == "" || spec.Port < 1 || spec.Port > 65535 || spec.RemoteURL == "" || spec.Network == "" || !filepath.IsAbs(spec.CacheDir) || strings.ContainsAny(spec.CacheDir, ":,") {
		return false, fmt.Errorf("mirror %q: name, port, remoteURL, network and an absolute cache dir without ':' or ',' are required", spec.Name)
	}
	st, err := c.MirrorState(ctx, spec)
	if err != nil {
		return false, err
	}
	if st.Exists && st.Current {
		if st.Running {
			return false, nil
		}
		if _, err := c.api.ContainerStart(ctx, spec.Name, client.ContainerStartOptions{}); err != nil {
			return false, fmt.Errorf("start mirror %s: %w", spec.Name, err)
		}
		return true, nil
	}
	if st.Exists {
		if err := c.removeContainer(ctx, spec.Name); err != nil {
			return false, err
		}
	}
	if err := os.MkdirAll(spec.CacheDir, 0o755); err != nil && c.host == "" {
		// Only meaningful when the engine shares our filesystem; with a VM
		// the engine creates the bind source itself.
		return false, fmt.Errorf("mirror %s cache dir: %w", spec.Name, err)
	}
	if err := c.ensureImage(ctx, spec.image()); err != nil {
		return false, err
	}
	// An engine on this machine shares our network namespace: a port in
	// use is found before anything is created.
	if spec.PublishIP.IsValid() && c.host == "" {
		l, err := net.Listen("tcp", spec.publish())
		if err != nil {
			return false, spec.portInUse(err)
		}
		l.Close()
	}
	port := network.MustParsePort(strconv.Itoa(spec.Port) + "/tcp")
	cfg := &container.Config{
		Image:        spec.image(),
		Env:          spec.env(),
		ExposedPorts: network.PortSet{port: struct{}{}},
		Labels: map[string]string{
			LabelManagedBy: ManagedBy,
			LabelMirror:    spec.Name,
			LabelSpecHash:  spec.Hash(),
			LabelNetwork:   spec.Network,
		},
	}
	hc := &container.HostConfig{
		NetworkMode:   container.NetworkMode(spec.Network),
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyUnlessStopped},
		// Binds (not Mounts) so the engine creates a missing source dir,
		// also on a VM where our MkdirAll cannot reach.
		Binds: []string{spec.CacheDir + ":" + registryDataDir},
	}
	if spec.PublishIP.IsValid() {
		hc.PortBindings = network.PortMap{port: {{HostIP: spec.PublishIP, HostPort: strconv.Itoa(spec.Port)}}}
	}
	nc := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
		spec.Network: {Aliases: []string{spec.Name}},
	}}
	if _, err := c.api.ContainerCreate(ctx, client.ContainerCreateOptions{Name: spec.Name, Config: cfg, HostConfig: hc, NetworkingConfig: nc}); err != nil {
		return false, fmt.Errorf("create mirror %s: %w", spec.Name, err)
	}
	if _, err := c.api.ContainerStart(ctx, spec.Name, client.ContainerStartOptions{}); err != nil {
		// Never leave a Created container behind: the next up would find
		// it "current" and try to start it again forever.
		if rerr := c.removeContainer(context.WithoutCancel(ctx), spec.Name); rerr != nil {
			return true, fmt.Errorf("start mirror %s: %w (and %v)", spec.Name, err, rerr)
		}
		if isPortError(err) {
			return false, spec.portInUse(err)
		}
		return false, fmt.Errorf("start mirror %s: %w", spec.Name, err)
	}
	return true, nil
}

// PortInUseError is a mirror whose host port something else holds.
type PortInUseError struct {
	Mirror string
	Addr   string
	Err    error
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("registry mirror %s: port %s is already in use (%v) (fix: stop what listens there, or give the mirror another port in registries.mirrors of ~/.klimax/config.yaml)", e.Mirror, e.Addr, e.Err)
}

func (e *PortInUseError) Unwrap() error { return e.Err }

func (s MirrorSpec) portInUse(err error) error {
	return &PortInUseError{Mirror: s.Name, Addr: s.publish(), Err: err}
}

// isPortError recognises the engine's refusal to publish a taken port.
func isPortError(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "port is already allocated") || strings.Contains(msg, "address already in use")
}

func (c *Client) ensureImage(ctx context.Context, ref string) error {
	if _, err := c.api.ImageInspect(ctx, ref); err == nil {
		return nil
	} else if !isNotFound(err) {
		return fmt.Errorf("inspect image %s: %w", ref, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	resp, err := c.api.ImagePull(pctx, ref, client.ImagePullOptions{})
	if err != nil {
		return fmt.Errorf("pull mirror image %s: %w (fix: make the image available to the engine (docker load, or a registry it reaches), or set registries.mirrorImage in ~/.klimax/config.yaml to one it has)", ref, err)
	}
	defer resp.Close()
	if err := resp.Wait(pctx); err != nil {
		return fmt.Errorf("pull mirror image %s: %w", ref, err)
	}
	return nil
}

func (c *Client) removeContainer(ctx context.Context, name string) error {
	_, err := c.api.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("remove container %s: %w", name, err)
	}
	return nil
}

// ManagedMirrors lists the names of klimax's mirror containers on network.
func (c *Client) ManagedMirrors(ctx context.Context, networkName string) ([]string, error) {
	f := make(client.Filters).Add("label", LabelManagedBy+"="+ManagedBy, LabelNetwork+"="+networkName)
	res, err := c.api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list mirrors: %w", err)
	}
	var names []string
	for _, ct := range res.Items {
		if n := ct.Labels[LabelMirror]; n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

// PruneMirrors removes klimax's mirror containers on networkName whose
// names are not in keep (mirrors removed from the config); their cache
// directories are kept. It returns the names removed.
func (c *Client) PruneMirrors(ctx context.Context, networkName string, keep []string) ([]string, error) {
	names, err := c.ManagedMirrors(ctx, networkName)
	if err != nil {
		return nil, err
	}
	wanted := map[string]bool{}
	for _, k := range keep {
		wanted[k] = true
	}
	var removed []string
	for _, n := range names {
		if wanted[n] {
			continue
		}
		if err := c.RemoveMirror(ctx, n); err != nil {
			return removed, err
		}
		removed = append(removed, n)
	}
	return removed, nil
}

// StopMirror stops a mirror container if it runs (the restart policy keeps
// it stopped until `up` starts it again).
func (c *Client) StopMirror(ctx context.Context, name string) error {
	timeout := 10
	_, err := c.api.ContainerStop(ctx, name, client.ContainerStopOptions{Timeout: &timeout})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("stop mirror %s: %w", name, err)
	}
	return nil
}

// RemoveMirror removes a klimax mirror container (never anything else).
func (c *Client) RemoveMirror(ctx context.Context, name string) error {
	res, err := c.api.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect mirror %s: %w", name, err)
	}
	if res.Container.Config == nil || res.Container.Config.Labels[LabelManagedBy] != ManagedBy {
		return fmt.Errorf("container %s: %w; left alone", name, errNotManaged)
	}
	return c.removeContainer(ctx, name)
}

// LoadImage loads a `docker save` tar stream into the engine.
func (c *Client) LoadImage(ctx context.Context, r io.Reader) error {
	_, err := c.LoadImages(ctx, r)
	return err
}
