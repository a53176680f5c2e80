package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// loPlane is the darwin dataplane (see render.go for the design). It has
// no build tag: it only runs the commands it renders through run and
// output, so the Linux tests drive it with a recorder.
type loPlane struct {
	run    func(argv []string) error
	output func(argv []string) ([]byte, error)
	pfDir  string
	egress string

	mu sync.Mutex
	// node is the last node seen: DelPod has no Node, and must not remove
	// an alias outside the pod range (127.0.0.1 is on lo0 too).
	node Node
	// token is this process's pf enable reference, released by DelNode.
	// A restarted netd takes a new one; pf then stays enabled until
	// reboot, which is what the user's own -E would do too.
	token string

	// newWG makes the mesh device (darwin: wireguard-go on a new utun);
	// nil: no mesh here. mesh is the device made (loplane_mesh.go).
	newWG  func(mtu int) (wgDevice, error)
	meshMu sync.Mutex
	mesh   *loMesh
}

func newLoPlane(o Options) (*loPlane, error) {
	if o.Runner == nil || o.Output == nil {
		return nil, errors.New("dataplane: Runner and Output are required")
	}
	if o.PFDir == "" || !filepath.IsAbs(o.PFDir) {
		return nil, fmt.Errorf("dataplane: PFDir %q must be an absolute directory", o.PFDir)
	}
	if o.Egress != "" && (len(o.Egress) > ifNameMax || !isIfName(o.Egress)) {
		return nil, fmt.Errorf("dataplane: egress interface %q is not a valid interface name", o.Egress)
	}
	return &loPlane{run: o.Runner, output: o.Output, pfDir: filepath.Clean(o.PFDir), egress: o.Egress}, nil
}

func (d *loPlane) lo0(cidr netip.Prefix) ([]netip.Addr, error) {
	out, err := d.output(argvShowLo0())
	if err != nil {
		return nil, fmt.Errorf("dataplane: ifconfig lo0: %w", err)
	}
	return parseLo0(out, cidr), nil
}

func (d *loPlane) EnsureNode(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.node = n
	have, err := d.lo0(n.CIDR)
	if err != nil {
		return err
	}
	if !slices.Contains(have, n.Gateway) {
		if err := d.run(argvAlias(n.Gateway)); err != nil {
			return fmt.Errorf("dataplane: alias %v on lo0: %w", n.Gateway, err)
		}
	}
	egress := d.egress
	if egress == "" {
		out, err := d.output(argvDefaultRoute())
		if err != nil {
			return fmt.Errorf("dataplane: default route: %w", err)
		}
		if egress, err = parseRouteInterface(out); err != nil {
			return err
		}
	}
	rules, err := renderAnchor(n, egress)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.pfDir, 0o700); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	file := filepath.Join(d.pfDir, PFAnchorFile)
	if err := atomicfile.WriteFile(file, []byte(rules), 0o600); err != nil {
		return fmt.Errorf("dataplane: write pf anchor: %w", err)
	}
	// Loading an anchor replaces its rules: a second EnsureNode never
	// duplicates them.
	if err := d.run(argvPFLoad(file)); err != nil {
		return fmt.Errorf("dataplane: load pf anchor %s: %w", PFAnchor, err)
	}
	if d.token == "" {
		out, err := d.output(argvPFEnable())
		if err != nil {
			return fmt.Errorf("dataplane: enable pf: %w", err)
		}
		if d.token, err = parsePFToken(out); err != nil {
			return err
		}
	}
	return nil
}

func (d *loPlane) AddPod(n Node, p Pod) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if err := checkPodIP(n, p.IP); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.node = n
	have, err := d.lo0(n.CIDR)
	if err != nil {
		return err
	}
	if slices.Contains(have, p.IP) {
		return nil
	}
	if err := d.run(argvAlias(p.IP)); err != nil {
		return fmt.Errorf("dataplane: alias %v on lo0: %w", p.IP, err)
	}
	return nil
}

func (d *loPlane) DelPod(p Pod) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.node.CIDR.IsValid() {
		return errors.New("dataplane: DelPod before the node is known (EnsureNode or Inventory first)")
	}
	if err := checkPodIP(d.node, p.IP); err != nil {
		return err
	}
	have, err := d.lo0(d.node.CIDR)
	if err != nil {
		return err
	}
	if !slices.Contains(have, p.IP) {
		return nil
	}
	if err := d.run(argvUnalias(p.IP)); err != nil {
		return fmt.Errorf("dataplane: remove alias %v from lo0: %w", p.IP, err)
	}
	return nil
}

func (d *loPlane) Inventory(n Node) (Inventory, error) {
	var inv Inventory
	if err := checkNode(n); err != nil {
		return inv, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.node = n
	have, err := d.lo0(n.CIDR)
	if err != nil {
		return inv, err
	}
	for _, a := range have {
		if a != n.Gateway {
			inv.Addrs = append(inv.Addrs, a)
		}
	}
	slices.SortFunc(inv.Addrs, netip.Addr.Compare)
	if !slices.Contains(have, n.Gateway) {
		return inv, nil
	}
	out, err := d.output(argvPFShowNAT())
	if err != nil {
		return inv, fmt.Errorf("dataplane: pf anchor %s: %w", PFAnchor, err)
	}
	inv.NodeReady = parsePFNAT(out)
	return inv, nil
}

func (d *loPlane) DelNode(n Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.run(argvPFFlush()); err != nil {
		return fmt.Errorf("dataplane: flush pf anchor %s: %w", PFAnchor, err)
	}
	if err := os.Remove(filepath.Join(d.pfDir, PFAnchorFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dataplane: %w", err)
	}
	if d.token != "" {
		if err := d.run(argvPFRelease(d.token)); err != nil {
			return fmt.Errorf("dataplane: release pf reference: %w", err)
		}
		d.token = ""
	}
	have, err := d.lo0(n.CIDR)
	if err != nil {
		return err
	}
	if slices.Contains(have, n.Gateway) {
		if err := d.run(argvUnalias(n.Gateway)); err != nil {
			return fmt.Errorf("dataplane: remove alias %v from lo0: %w", n.Gateway, err)
		}
	}
	return nil
}

// SetPolicy accepts only a policy that isolates nothing: darwin's pods
// share lo0, so there is no per-pod path to filter (pf could match pod
// addresses, but a pod can bind any alias of lo0, which makes the source
// address no proof of the pod).
func (d *loPlane) SetPolicy(n Node, p Pod, pol Policy) error {
	if err := checkPolicy(pol); err != nil {
		return err
	}
	if pol.Ingress.Isolated || pol.Egress.Isolated {
		return ErrPolicyUnsupported
	}
	return nil
}

// SetServices: darwin's pods reach Services through the node's userspace
// proxy; pf has no per-pod path to translate on.
func (d *loPlane) SetServices(n Node, svcs []Service) error {
	if err := checkServices(n, svcs); err != nil {
		return err
	}
	return ErrServicesUnsupported
}
