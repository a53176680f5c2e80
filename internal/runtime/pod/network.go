package pod

// The pod's own network, the sandbox step the kubelet calls RunPodSandbox:
// before its first container starts a pod gets a network namespace and an
// address from the node's Network (k3sm-netd); every container, exec,
// probe, hook and port-forward of the pod then runs or dials in it. The
// address is the pod's for its whole life (container restarts, daemon
// restarts: it is persisted in pod.json) and is released once the pod is
// gone.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
	"github.com/k3sm-dev/k3sm/internal/runtime/podnet"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// Network hands pods their own network. A nil Network (no k3sm-netd: the
// daemon does not run as root, or the pod network is off) leaves every pod
// in the node's network, as hostNetwork pods always are.
type Network interface {
	// Setup gives the pod its namespace and address; called again for
	// the same uid it returns the same ones. ErrNetworkNotReady: the node
	// has no pod range yet (retry).
	Setup(ctx context.Context, uid, namespace, name string) (PodNetwork, error)
	// Teardown releases the pod's address and removes its namespace; a
	// pod the network does not know is not an error.
	Teardown(ctx context.Context, uid string) error
	// Pods lists the uids that hold an address, for releasing what a
	// crash left behind.
	Pods(ctx context.Context) ([]string, error)
}

// ErrNetworkNotReady: the node's pod range is not configured yet.
var ErrNetworkNotReady = errors.New("network not ready: the node has no pod range (Node.spec.podCIDR) yet")

// PodNetwork is one pod's network.
type PodNetwork struct {
	IP string `json:"ip"`
	// NetNS is the path of the pod's network namespace (Linux).
	NetNS string `json:"netns,omitempty"`
	// UserNS is the user namespace that owns NetNS when the runtime is
	// not root (the runtime's own, pinned by netd): the pod's shims run
	// and dial inside both.
	UserNS string `json:"userns,omitempty"`
}

// dial connects to addr from inside the pod's network.
func (m *Manager) dial(ctx context.Context, pn PodNetwork, network, addr string) (net.Conn, error) {
	if pn.UserNS != "" {
		return sandbox.DialIn(ctx, m.cfg.ShimPath, pn.UserNS, pn.NetNS, network, addr)
	}
	return podnet.Dial(ctx, pn.NetNS, network, addr)
}

// ownNetwork reports whether the pod gets a network of its own.
func (p *managedPod) ownNetwork() bool {
	return p.m.cfg.Network != nil && !p.spec.GetHostNetwork()
}

// ensureNetwork sets up the pod's network before its first container, and
// retries (reporting why on the containers and in an Event, as the kubelet's
// FailedCreatePodSandBox) until it works or the pod goes away.
func (p *managedPod) ensureNetwork(ctx context.Context) bool {
	p.mu.Lock()
	need := p.ownNetwork() && (p.net.IP == "" || netnsGone(p.net.NetNS))
	gone := p.net.IP != ""
	p.mu.Unlock()
	if !need {
		return true
	}
	if gone {
		// The recorded namespace is not pinned here: its pin went with
		// another mount namespace (netd pins the pod's namespace again),
		// or the namespace went with the pod network (`k3sm uninstall`
		// without --purge, then install again: a new sandbox, as the
		// kubelet makes after a reboot, with an address netd gives).
		p.m.log.Info("pod network namespace not pinned; setting the pod network up again", "pod", p.key(), "netns", p.net.NetNS, "ip", p.net.IP)
	}
	delay, lastMsg := backoff.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}, ""
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		pn, err := p.m.cfg.Network.Setup(sctx, p.uid, p.namespace, p.name)
		cancel()
		if err == nil {
			// Neither written nor published on its own: it goes with
			// the next change, the container's start (netd gives the
			// same network again for the uid if the daemon dies first).
			p.mu.Lock()
			p.net = pn
			p.mu.Unlock()
			return true
		}
		msg := "Failed to create pod sandbox: " + err.Error()
		if msg != lastMsg && !errors.Is(err, ErrNetworkNotReady) {
			p.event(warning, "FailedCreatePodSandBox", "", msg)
		}
		lastMsg = msg
		p.update(func() {
			for _, c := range p.all() {
				if c.state.Waiting != nil {
					c.state.Waiting.Message = msg
				}
			}
		})
		select {
		case <-time.After(delay.Next()):
		case <-p.deleteCh:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// checkNetNS runs once for an attempt the daemon re-attached to: its
// process must still run in the pod's network namespace. When netd could
// not pin that namespace again (its veth was removed while k3sm was down,
// so nothing tied it to the pod any more), the pod's address now lives in
// a new namespace and the container would run on, cut off from it. It is
// restarted into the pod's network instead, as the kubelet kills and
// re-creates a pod whose sandbox changed, and the Event says why.
func (p *managedPod) checkNetNS(ctx context.Context, c *container, proc Process, kill chan<- string) {
	select {
	case <-p.netReady:
	case <-ctx.Done():
		return
	}
	p.mu.Lock()
	pn, own := p.net, p.ownNetwork()
	p.mu.Unlock()
	if !own || pn.NetNS == "" {
		return
	}
	if in, known := podnet.InNetNS(proc.Pid(), pn.NetNS); in || !known {
		return
	}
	msg := fmt.Sprintf("Pod sandbox changed, it will be killed and re-created: container %s runs in a network namespace that is no longer the pod's (the pod's address %s is in a new one)", c.name, pn.IP)
	p.m.log.Warn("container cut off from its pod's network; restarting it", "pod", p.key(), "container", c.name, "netns", pn.NetNS)
	p.event(warning, "SandboxChanged", c.name, msg)
	select {
	case kill <- msg:
	case <-ctx.Done():
	}
}

// netnsGone reports whether a recorded network namespace is no longer
// pinned where the daemon sees it (none is recorded on darwin): the file
// is gone, or its mount went with a mount namespace of an earlier netd.
// Setting the network up again has netd pin the pod's namespace again
// (or make a new one when it is gone for good).
func netnsGone(path string) bool {
	return path != "" && !podnet.Pinned(path)
}

// releaseNetwork returns the pod's address once its containers stopped. A
// network that cannot be reached now is cleaned up by releaseOrphans.
func (m *Manager) releaseNetwork(p *managedPod) {
	p.mu.Lock()
	ip := p.net.IP
	p.mu.Unlock()
	if m.cfg.Network == nil || ip == "" {
		return
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		err := m.cfg.Network.Teardown(ctx, p.uid)
		cancel()
		if err == nil {
			return
		}
		if try == 2 || m.ctx.Err() != nil {
			m.log.Warn("release pod network (retried later)", "pod", p.key(), "ip", ip, "err", err)
			return
		}
		time.Sleep(time.Second)
	}
}

// releaseOrphans releases the addresses of pods this daemon does not run
// (deleted while the network could not be reached, or by a daemon that
// crashed mid-delete): at start, then every period.
func (m *Manager) releaseOrphans(ctx context.Context, period time.Duration) {
	if m.cfg.Network == nil {
		return
	}
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		uids, err := m.cfg.Network.Pods(lctx)
		cancel()
		if err == nil {
			for _, uid := range uids {
				if m.get(uid) != nil {
					continue
				}
				tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if err := m.cfg.Network.Teardown(tctx, uid); err != nil {
					m.log.Warn("release orphaned pod network", "uid", uid, "err", err)
				} else {
					m.log.Info("released orphaned pod network", "uid", uid)
				}
				cancel()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// dialFunc adapts dial to the address form of http.Transport and gRPC.
func (p *managedPod) dialFunc() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		p.mu.Lock()
		pn := p.net
		p.mu.Unlock()
		return p.m.dial(ctx, pn, "tcp", addr)
	}
}

// probeHost is the host a probe without one targets: the pod's IP with a
// network of its own, else 127.0.0.1.
func (p *managedPod) probeHost(h string) string {
	if h != "" {
		return h
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.net.IP != "" {
		return p.net.IP
	}
	return "127.0.0.1"
}

// PortForwardDial connects to port on the pod's own loopback (inside its
// network namespace), as CRI runtimes do for kubectl port-forward; a pod
// without a network of its own is reached on the node's 127.0.0.1.
func (m *Manager) PortForwardDial(ctx context.Context, uid string, port int32) (net.Conn, error) {
	p := m.get(uid)
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	p.mu.Lock()
	pn, own := p.net, p.ownNetwork()
	p.mu.Unlock()
	if own && pn.NetNS == "" {
		return nil, fmt.Errorf("pod %s has no network yet", uid)
	}
	return m.dial(ctx, pn, "tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(port)))
}
