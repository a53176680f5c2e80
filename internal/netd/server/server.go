// Package server is k3sm-netd: it serves the wire protocol on a unix
// socket to the one uid allowed to call (checked from the kernel's peer
// credentials on every connection), allocates each pod an address from the
// node's range, keeps the allocations in a state file, and applies them
// through the dataplane; it also runs the node's WireGuard mesh device
// (mesh.go), with a private key only it reads. At start it resyncs the
// system to that file, so running pods keep their addresses across a netd
// restart and the mesh comes back.
package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// BridgeName is the node's bridge, every pod's gateway.
const BridgeName = "k3sm0"

// DataplaneFactory builds the system's data path; Start calls it once.
type DataplaneFactory func() (dataplane.Dataplane, error)

// Config is one netd.
type Config struct {
	// Socket is the unix socket to serve on. Its directory is created 0700
	// (owned by AllowedUID) when missing and must not be writable by others.
	Socket string
	// StateFile keeps the node's range and the allocations.
	StateFile string
	// NetNSDir holds the pods' network namespace files (Linux).
	NetNSDir string
	// KeyDir holds the mesh's private keys, one file per KeyRef; netd
	// makes it 0700 and refuses one others may enter. Empty: mesh-keys
	// beside StateFile.
	KeyDir string
	// AllowedUID is the only uid that may call: k3sm's own.
	AllowedUID int
	// NewDataplane builds the data path.
	NewDataplane DataplaneFactory
	// Logger defaults to text on stderr.
	Logger *slog.Logger
	// IdleTimeout bounds the wait for a connection's next request (default 30s).
	IdleTimeout time.Duration
}

// Server is a running netd.
type Server struct {
	cfg Config
	log *slog.Logger
	dp  dataplane.Dataplane
	ln  *net.UnixListener

	mu   sync.Mutex // the state, and the dataplane but for a teardown's removal (teardownPod)
	cidr netip.Prefix
	rs   ranges
	last netip.Addr
	pods map[string]*pod
	// svcs is the unfinished SetServices generation, chunks so far.
	svcs *pendingServices
	// mesh is the node's mesh (nil: none).
	mesh *meshState

	conns     sync.WaitGroup
	connMu    sync.Mutex
	open      map[net.Conn]struct{}
	closed    bool
	done      chan struct{}
	serveErr  error
	closeOnce sync.Once
}

// netnsFiles: only Linux gives pods a namespace of their own; elsewhere
// pods share the host's stack and have no file to prove them alive.
var netnsFiles = runtime.GOOS == "linux"

// Start loads the state, resyncs the system to it, and serves on the socket.
func Start(cfg Config) (*Server, error) {
	if !filepath.IsAbs(cfg.Socket) || !filepath.IsAbs(cfg.StateFile) || !filepath.IsAbs(cfg.NetNSDir) {
		return nil, fmt.Errorf("netd: socket, stateFile and netnsDir must be absolute paths (got %q, %q, %q)", cfg.Socket, cfg.StateFile, cfg.NetNSDir)
	}
	if cfg.KeyDir != "" && !filepath.IsAbs(cfg.KeyDir) {
		return nil, fmt.Errorf("netd: keyDir must be an absolute path (got %q)", cfg.KeyDir)
	}
	if cfg.AllowedUID < 0 {
		return nil, fmt.Errorf("netd: allowedUID %d is not a uid", cfg.AllowedUID)
	}
	if cfg.NewDataplane == nil {
		return nil, errors.New("netd: no dataplane")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, open: map[net.Conn]struct{}{}, done: make(chan struct{})}
	var err error
	if s.cidr, s.last, s.rs, s.pods, s.mesh, err = loadState(cfg.StateFile); err != nil {
		return nil, fmt.Errorf("netd: %w", err)
	}
	if s.dp, err = cfg.NewDataplane(); err != nil {
		return nil, fmt.Errorf("netd: dataplane: %w", err)
	}
	if err := s.resync(); err != nil {
		return nil, fmt.Errorf("netd: resync: %w", err)
	}
	if s.ln, err = listen(cfg.Socket, cfg.AllowedUID); err != nil {
		return nil, fmt.Errorf("netd: %w", err)
	}
	s.log.Info("k3sm-netd serving", "socket", cfg.Socket, "allowedUID", cfg.AllowedUID, "podCIDR", s.cidrString(), "pods", len(s.pods))
	go s.serve()
	return s, nil
}

// listen makes the socket: 0600 and owned by uid, in a directory others
// cannot write (so nobody swaps the socket under the client); a stale
// socket from an earlier run is removed.
func listen(path string, uid int) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(dir, uid, -1); err != nil {
			return nil, err
		}
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() || st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("socket directory %s is %v: it must be a directory others cannot write (chmod go-w %s)", dir, st.Mode(), dir)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; remove it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err == nil {
		err = os.Chown(path, uid, -1)
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Close stops serving, removes the socket and waits for the connections
// to end. Pods keep their network: a netd restart must not cut them off.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.connMu.Lock()
		s.closed = true
		for c := range s.open {
			c.Close()
		}
		s.connMu.Unlock()
		s.ln.Close()
	})
	<-s.done
	s.conns.Wait()
	return nil
}

// Wait returns when serving stops: nil after Close, else why it failed.
func (s *Server) Wait() error {
	<-s.done
	return s.serveErr
}

func (s *Server) serve() {
	defer close(s.done)
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.connMu.Lock()
			closed := s.closed
			s.connMu.Unlock()
			if !closed {
				s.serveErr = err
				s.log.Error("accept", "err", err)
			}
			return
		}
		s.connMu.Lock()
		if s.closed {
			s.connMu.Unlock()
			c.Close()
			continue
		}
		s.open[c] = struct{}{}
		s.conns.Add(1)
		s.connMu.Unlock()
		go func() {
			defer s.conns.Done()
			s.handle(c)
			s.connMu.Lock()
			delete(s.open, c)
			s.connMu.Unlock()
			c.Close()
		}()
	}
}

const writeTimeout = 10 * time.Second

func (s *Server) reply(c net.Conn, r *wire.Response) error {
	r.Version = wire.Version
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	return wire.WriteResponse(c, r)
}

func failure(code, format string, a ...any) *wire.Response {
	return &wire.Response{Code: code, Error: fmt.Sprintf(format, a...)}
}

// handle serves one connection: the peer's uid first, then one request
// per frame until the peer closes, idles out or breaks the framing.
func (s *Server) handle(c *net.UnixConn) {
	uid, err := peerUID(c)
	if err != nil || uid != s.cfg.AllowedUID {
		s.log.Warn("refused a connection", "uid", uid, "err", err)
		msg := fmt.Sprintf("uid %d may not use k3sm-netd", uid)
		if err != nil {
			msg = "cannot read the peer's credentials: " + err.Error()
		}
		s.reply(c, failure(wire.CodeDenied, "%s", msg))
		// Closing with the peer's request unread would reset the
		// connection, and the peer might never see why: end our side and
		// let it finish (bounded in time and bytes).
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(time.Second))
		io.Copy(io.Discard, io.LimitReader(c, wire.MaxFrame))
		return
	}
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		req, err := wire.ReadRequest(c)
		var resp *wire.Response
		switch {
		case err == nil:
			resp = s.dispatch(req)
		case errors.Is(err, wire.ErrMalformed):
			// The frame was read whole: answer and keep the connection.
			resp = failure(wire.CodeInvalid, "%v", err)
		case errors.Is(err, wire.ErrFrameTooLarge):
			// The body was not read: answer, then drop the connection.
			s.log.Warn("oversized frame", "err", err)
			s.reply(c, failure(wire.CodeInvalid, "%v", err))
			return
		default:
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("connection ended", "err", err)
			}
			return
		}
		if err := s.reply(c, resp); err != nil {
			return
		}
	}
}

func (s *Server) dispatch(req *wire.Request) *wire.Response {
	if req.Verb == wire.VerbTeardownPod {
		// Takes the lock itself: the slow part runs outside it.
		return s.teardownPod(req.TeardownPod)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Verb {
	case wire.VerbConfigure:
		return s.configure(req.Configure)
	case wire.VerbSetupPod:
		return s.setupPod(req.SetupPod)
	case wire.VerbSetPolicy:
		return s.setPolicy(req.SetPolicy)
	case wire.VerbSetServices:
		return s.setServices(req.SetServices)
	case wire.VerbConfigureMesh:
		return s.configureMesh(req.ConfigureMesh)
	case wire.VerbSetMeshPeers:
		return s.setMeshPeers(req.SetMeshPeers)
	case wire.VerbMeshStatus:
		return s.meshStatus()
	case wire.VerbRemoveMesh:
		return s.removeMesh()
	case wire.VerbListPods:
		resp := &wire.Response{Pods: []wire.PodResult{}}
		for _, p := range sortedPods(s.pods) {
			resp.Pods = append(resp.Pods, s.podResult(p))
		}
		return resp
	}
	return failure(wire.CodeInvalid, "verb %q", req.Verb) // Validate refused it already
}

func (s *Server) node() dataplane.Node {
	return dataplane.Node{CIDR: s.cidr, Gateway: gateway(s.cidr), Bridge: BridgeName, ServiceCIDR: s.rs.svc, ClusterCIDR: s.rs.cluster}
}

func (s *Server) cidrString() string {
	if !s.cidr.IsValid() {
		return ""
	}
	return s.cidr.String()
}

func (s *Server) dpPod(p *pod) dataplane.Pod {
	dp := dataplane.Pod{UID: p.uid, IP: p.ip}
	if netnsFiles {
		dp.NetNS = filepath.Join(s.cfg.NetNSDir, p.uid)
		dp.HostIf = dataplane.HostIfName(p.uid)
		if p.userns {
			dp.UserNS, dp.Owner = wire.UserNSPath(dp.NetNS), s.cfg.AllowedUID
		}
	}
	return dp
}

func (s *Server) podResult(p *pod) wire.PodResult {
	return wire.PodResult{UID: p.uid, Namespace: p.namespace, Name: p.name, IP: p.ip.String(),
		PrefixLen: s.cidr.Bits(), Gateway: gateway(s.cidr).String(), NetNS: s.dpPod(p).NetNS, UserNS: s.dpPod(p).UserNS}
}

func (s *Server) save() error {
	return saveState(s.cfg.StateFile, s.cidr, s.last, s.rs, s.pods, s.mesh)
}

func (s *Server) configure(a *wire.ConfigureArgs) *wire.Response {
	cidr, svc, cluster, err := wire.ParseRanges(a)
	if err != nil {
		return failure(wire.CodeInvalid, "%v", err)
	}
	rs := ranges{svc, cluster}
	if s.cidr.IsValid() && cidr == s.cidr && rs != s.rs {
		if len(s.pods) > 0 {
			return failure(wire.CodeConflict, "the node's Service range is %v and cluster range %v with %d pods on it; they cannot become %v and %v until the pods are torn down", s.rs.svc, s.rs.cluster, len(s.pods), svc, cluster)
		}
		if err := s.dp.DelNode(s.node()); err != nil {
			return failure(wire.CodeInternal, "removing the node's network for %s: %v", s.cidr, err)
		}
	}
	if s.cidr.IsValid() && cidr != s.cidr {
		if len(s.pods) > 0 {
			return failure(wire.CodeConflict, "the node's pod CIDR is %s and %d pods hold addresses in it; it cannot become %s until they are torn down", s.cidr, len(s.pods), cidr)
		}
		if err := s.dp.DelNode(s.node()); err != nil {
			return failure(wire.CodeInternal, "removing the node's network for %s: %v", s.cidr, err)
		}
		s.log.Info("pod CIDR changed", "from", s.cidr, "to", cidr)
	}
	changed := cidr != s.cidr || rs != s.rs
	if changed {
		// Recorded before the system changes, so a crash in between is
		// resynced at the next start.
		if cidr != s.cidr {
			s.last = netip.Addr{}
		}
		s.cidr, s.rs = cidr, rs
		if err := s.save(); err != nil {
			return failure(wire.CodeInternal, "%v", err)
		}
	}
	n := s.node()
	if err := s.dp.EnsureNode(n); err != nil {
		return failure(wire.CodeInternal, "setting up the node's network for %s: %v", cidr, err)
	}
	if changed && s.mesh != nil && s.mesh.up {
		// The device's address and rules follow the node's range.
		if mp, ok := s.dp.(dataplane.MeshPlane); ok {
			if err := s.checkPeers(s.mesh, s.mesh.peers); err != nil {
				s.log.Warn("dropping the recorded mesh peers", "err", err)
				s.mesh.peers = nil
				if err := s.save(); err != nil {
					return failure(wire.CodeInternal, "%v", err)
				}
			}
			if err := s.applyMesh(mp, s.mesh); err != nil {
				s.mesh.up = false
				return failure(wire.CodeInternal, "the node's ranges changed, and the mesh could not follow: %v", err)
			}
		}
	}
	res := &wire.NodeResult{PodCIDR: cidr.String(), Gateway: n.Gateway.String(), Bridge: n.Bridge}
	if svc.IsValid() {
		res.ServiceCIDR = svc.String()
	}
	if cluster.IsValid() {
		res.ClusterCIDR = cluster.String()
	}
	return &wire.Response{Configure: res}
}

func (s *Server) setupPod(a *wire.SetupPodArgs) *wire.Response {
	if !s.cidr.IsValid() {
		return failure(wire.CodeNotConfigured, "the node's pod network is not configured yet (Configure with the node's podCIDR first)")
	}
	if a.FromPid > 0 && (s.cfg.AllowedUID == 0 || !netnsFiles) {
		return failure(wire.CodeInvalid, "fromPid: only a runtime that is not root, on Linux, brings its own namespaces; a root runtime's pods get netd's")
	}
	if p := s.pods[a.UID]; p != nil {
		if p.userns != (a.FromPid > 0) {
			return failure(wire.CodeConflict, "pod %s/%s was set up %s; set it up the same way again", p.namespace, p.name, map[bool]string{true: "with its runtime's namespaces (fromPid)", false: "in a namespace of netd's"}[p.userns])
		}
		if p.namespace != a.Namespace || p.name != a.Name {
			return failure(wire.CodeConflict, "pod uid %s is %s/%s, not %s/%s", a.UID, p.namespace, p.name, a.Namespace, a.Name)
		}
		if p.removing != nil {
			return failure(wire.CodeConflict, "pod %s/%s is being torn down; set it up again once TeardownPod has answered", p.namespace, p.name)
		}
		// Again: same address, and AddPod repairs what is missing.
		dp := s.dpPod(p)
		dp.FromPid = a.FromPid
		if err := s.dp.AddPod(s.node(), dp); err != nil {
			return failure(wire.CodeInternal, "pod %s/%s: %v", p.namespace, p.name, err)
		}
		return &wire.Response{Pod: ptr(s.podResult(p))}
	}
	used := make(map[netip.Addr]bool, len(s.pods))
	for _, p := range s.pods {
		used[p.ip] = true
	}
	ip, ok := allocate(s.cidr, s.last, func(ip netip.Addr) bool { return used[ip] })
	if !ok {
		return failure(wire.CodeConflict, "no free pod address: all %d of %s are in use (lower the node's maxPods or give it a larger podCIDR)", len(s.pods), s.cidr)
	}
	p := &pod{uid: a.UID, namespace: a.Namespace, name: a.Name, ip: ip, userns: a.FromPid > 0}
	prevLast := s.last
	s.pods[p.uid], s.last = p, ip
	// Persisted while the system changes, not before: the fsync costs as
	// much as the links, and a crash that leaves links and a namespace
	// without a record is cleaned up at the next start (removeUnclaimed).
	// s.pods does not change meanwhile: the caller holds s.mu.
	saved := make(chan error, 1)
	go func() { saved <- s.save() }()
	dp := s.dpPod(p)
	dp.FromPid = a.FromPid
	addErr := s.dp.AddPod(s.node(), dp)
	saveErr := <-saved
	if addErr != nil || saveErr != nil {
		if derr := s.dp.DelPod(s.dpPod(p)); derr != nil {
			s.log.Error("rolling back a failed pod setup", "uid", p.uid, "err", derr)
		}
		delete(s.pods, p.uid)
		if saveErr != nil {
			// The file holds what it held before (atomicfile).
			s.last = prevLast
			return failure(wire.CodeInternal, "%v", saveErr)
		}
		if serr := s.save(); serr != nil {
			s.log.Error("rolling back a failed pod setup", "uid", p.uid, "err", serr)
		}
		return failure(wire.CodeInternal, "pod %s/%s: %v", p.namespace, p.name, addErr)
	}
	s.log.Info("pod network up", "uid", p.uid, "pod", p.namespace+"/"+p.name, "ip", ip)
	return &wire.Response{Pod: ptr(s.podResult(p))}
}

// teardownPod removes a pod's network. Deleting a veth and unmounting a
// namespace take ~25 ms, so they run outside the lock, concurrently with
// other pods' (a burst of deletions took 3.2 s for 100 pods one at a time):
// the pod stays in the state, holding its address, until they are done,
// and meanwhile a setup or policy of that pod is refused.
func (s *Server) teardownPod(a *wire.TeardownPodArgs) *wire.Response {
	s.mu.Lock()
	p := s.pods[a.UID]
	if p == nil {
		s.mu.Unlock()
		return failure(wire.CodeNotFound, "pod uid %s has no network from k3sm-netd", a.UID)
	}
	if wait := p.removing; wait != nil {
		// Another teardown of the same pod: answer as it ends.
		s.mu.Unlock()
		<-wait
		return s.teardownPod(a)
	}
	done := make(chan struct{})
	p.removing = done
	dp := s.dpPod(p)
	s.mu.Unlock()

	err := s.dp.DelPod(dp)

	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(done)
	p.removing = nil
	if err != nil {
		return failure(wire.CodeInternal, "pod %s/%s: %v", p.namespace, p.name, err)
	}
	delete(s.pods, p.uid)
	if err := s.save(); err != nil {
		return failure(wire.CodeInternal, "%v", err)
	}
	s.log.Info("pod network down", "uid", p.uid, "pod", p.namespace+"/"+p.name, "ip", p.ip)
	return &wire.Response{}
}

// setPolicy applies a pod's NetworkPolicy. It is not kept in the state
// file: the kernel keeps the rules across a netd restart, DelPod removes
// them with the pod, and the node sends every pod's policy again
// periodically, which repairs whatever was lost (a reboot, a flushed
// ruleset).
func (s *Server) setPolicy(a *wire.SetPolicyArgs) *wire.Response {
	p := s.pods[a.UID]
	if p == nil || p.removing != nil {
		return failure(wire.CodeNotFound, "pod uid %s has no network from k3sm-netd", a.UID)
	}
	pol, err := dataplanePolicy(a)
	if err != nil {
		return failure(wire.CodeInvalid, "%v", err)
	}
	if err := s.dp.SetPolicy(s.node(), s.dpPod(p), pol); err != nil {
		if errors.Is(err, dataplane.ErrPolicyUnsupported) {
			return failure(wire.CodeUnsupported, "pod %s/%s: %v", p.namespace, p.name, err)
		}
		return failure(wire.CodeInternal, "pod %s/%s: %v", p.namespace, p.name, err)
	}
	s.log.Debug("pod network policy set", "uid", p.uid, "pod", p.namespace+"/"+p.name,
		"ingressIsolated", pol.Ingress.Isolated, "ingressRules", len(pol.Ingress.Rules),
		"egressIsolated", pol.Egress.Isolated, "egressRules", len(pol.Egress.Rules))
	return &wire.Response{}
}

// pendingServices collects the chunks of one SetServices generation.
type pendingServices struct {
	gen       uint64
	next      int
	svcs      []dataplane.Service
	endpoints int
}

// setServices takes one chunk and, at the final one, replaces the
// node's Services with the generation's whole set. Like policies, the set
// is not kept in the state file: the kernel keeps the table across a netd
// restart and the node sends the full set again periodically.
func (s *Server) setServices(a *wire.SetServicesArgs) *wire.Response {
	if !s.cidr.IsValid() {
		return failure(wire.CodeNotConfigured, "SetServices before Configure: the node's pod network is not set up")
	}
	if err := wire.CheckSetServices(a); err != nil {
		return failure(wire.CodeInvalid, "%v", err)
	}
	for _, sp := range a.Services {
		ip, _ := wire.ParseServiceAddr("ip", sp.IP)
		if err := wire.CheckServiceRange(sp, ip, s.cidr, s.rs.svc, s.rs.cluster); err != nil {
			return failure(wire.CodeInvalid, "%v", err)
		}
	}
	if a.Chunk == 0 {
		s.svcs = &pendingServices{gen: a.Generation}
	} else if s.svcs == nil || s.svcs.gen != a.Generation || s.svcs.next != a.Chunk {
		s.svcs = nil
		return failure(wire.CodeConflict, "SetServices generation %d chunk %d is out of order (send the set again from chunk 0)", a.Generation, a.Chunk)
	}
	p := s.svcs
	if len(p.svcs)+len(a.Services) > wire.MaxServicePorts {
		s.svcs = nil
		return failure(wire.CodeInvalid, "setServices: generation %d has more than %d Service ports", a.Generation, wire.MaxServicePorts)
	}
	for _, sp := range a.Services {
		p.endpoints += len(sp.Endpoints)
		p.svcs = append(p.svcs, dataplaneService(sp))
	}
	if p.endpoints > wire.MaxServiceEndpointsTotal {
		s.svcs = nil
		return failure(wire.CodeInvalid, "setServices: generation %d has more than %d endpoints in all", a.Generation, wire.MaxServiceEndpointsTotal)
	}
	p.next++
	if !a.Final {
		return &wire.Response{}
	}
	s.svcs = nil
	start := time.Now()
	if err := s.dp.SetServices(s.node(), p.svcs); err != nil {
		if errors.Is(err, dataplane.ErrServicesUnsupported) {
			return failure(wire.CodeUnsupported, "%v", err)
		}
		return failure(wire.CodeInternal, "%v", err)
	}
	s.log.Debug("services set", "generation", a.Generation, "chunks", p.next, "servicePorts", len(p.svcs), "took", time.Since(start))
	return &wire.Response{}
}

// dataplaneService converts a Service port CheckSetServices accepted.
func dataplaneService(sp wire.ServicePort) dataplane.Service {
	proto, _ := wire.ParseServiceProtocol(sp.Protocol)
	ip, _ := wire.ParseServiceAddr("ip", sp.IP)
	out := dataplane.Service{Protocol: dataplane.Protocol(proto), IP: ip, Port: sp.Port, External: sp.External,
		OnNode: sp.NodePort || sp.LoadBalancer, Local: sp.Local}
	for _, e := range sp.Endpoints {
		eip, _ := wire.ParseServiceAddr("endpoint ip", e.IP)
		out.Endpoints = append(out.Endpoints, netip.AddrPortFrom(eip, e.Port))
	}
	return out
}

// dataplanePolicy re-validates the arguments (ReadRequest did, but the
// types the data path builds rules from come only from here) and converts
// them.
func dataplanePolicy(a *wire.SetPolicyArgs) (dataplane.Policy, error) {
	var pol dataplane.Policy
	for _, side := range []struct {
		name string
		in   wire.PolicyDirection
		out  *dataplane.Direction
	}{{"ingress", a.Ingress, &pol.Ingress}, {"egress", a.Egress, &pol.Egress}} {
		if err := wire.CheckPolicyDirection(side.name, side.in); err != nil {
			return pol, err
		}
		side.out.Isolated = side.in.Isolated
		for _, r := range side.in.Rules {
			var rule dataplane.Rule
			for _, p := range r.Peers {
				cidr, _ := wire.ParsePolicyCIDR(p.CIDR)
				peer := dataplane.Peer{CIDR: cidr}
				for _, e := range p.Except {
					ex, _ := wire.ParsePolicyCIDR(e)
					peer.Except = append(peer.Except, ex)
				}
				rule.Peers = append(rule.Peers, peer)
			}
			for _, p := range r.Ports {
				proto, _ := wire.ParsePolicyProtocol(p.Protocol)
				rule.Ports = append(rule.Ports, dataplane.Port{Protocol: dataplane.Protocol(proto), Port: p.Port, EndPort: p.EndPort})
			}
			side.out.Rules = append(side.out.Rules, rule)
		}
	}
	return pol, nil
}

// resync makes the system match the state: the node, every pod that still
// runs (its namespace file exists), nothing for the rest, and none of our
// links or namespaces that no record claims. Only the node's failures stop
// the start; a pod that cannot be repaired or removed is logged and kept
// for the next try.
func (s *Server) resync() error {
	if !s.cidr.IsValid() {
		return nil
	}
	n := s.node()
	if err := s.dp.EnsureNode(n); err != nil {
		return err
	}
	changed := false
	for _, p := range sortedPods(s.pods) {
		dp := s.dpPod(p)
		if netnsFiles {
			if _, err := os.Lstat(dp.NetNS); errors.Is(err, fs.ErrNotExist) {
				s.log.Info("pod gone while netd was down, releasing its address", "uid", p.uid, "pod", p.namespace+"/"+p.name, "ip", p.ip)
				if err := s.dp.DelPod(dp); err != nil {
					s.log.Error("removing a gone pod's network", "uid", p.uid, "err", err)
					continue
				}
				delete(s.pods, p.uid)
				changed = true
				continue
			}
		}
		// AddPod keeps what exists: a running pod is not disturbed.
		if err := s.dp.AddPod(n, dp); err != nil {
			s.log.Error("repairing a pod's network", "uid", p.uid, "pod", p.namespace+"/"+p.name, "err", err)
		}
	}
	if changed {
		if err := s.save(); err != nil {
			return err
		}
	}
	inv, err := s.dp.Inventory(n)
	if err != nil {
		return err
	}
	s.removeUnclaimed(inv)
	// Last, and never stopping the start: the pods matter more.
	s.resyncMesh()
	return nil
}

// removeUnclaimed removes the pod links and the namespace files under
// NetNSDir that inv lists and no recorded pod claims (what a crash left),
// logging each; it returns what it could not remove.
func (s *Server) removeUnclaimed(inv dataplane.Inventory) []error {
	claimedIf, claimedNS := map[string]bool{}, map[string]bool{}
	for _, p := range s.pods {
		dp := s.dpPod(p)
		claimedIf[dp.HostIf], claimedNS[dp.NetNS], claimedNS[dp.UserNS] = true, true, true
	}
	var errs []error
	for _, h := range inv.HostIfs {
		if !claimedIf[h] && strings.HasPrefix(h, dataplane.HostIfPrefix) {
			s.log.Info("removing an unclaimed pod link", "link", h)
			if err := s.dp.DelPod(dataplane.Pod{HostIf: h}); err != nil {
				s.log.Error("removing an unclaimed pod link", "link", h, "err", err)
				errs = append(errs, err)
			}
		}
	}
	for _, ns := range inv.NetNS {
		if !filepath.IsAbs(ns) {
			ns = filepath.Join(s.cfg.NetNSDir, ns)
		}
		// Only files under our directory are ours to remove.
		if claimedNS[ns] || filepath.Dir(ns) != filepath.Clean(s.cfg.NetNSDir) {
			continue
		}
		uid := filepath.Base(ns)
		p := dataplane.Pod{NetNS: ns}
		if wire.CheckUID(uid) == nil {
			p.UID, p.HostIf = uid, dataplane.HostIfName(uid)
		}
		s.log.Info("removing an unclaimed pod namespace", "netns", ns)
		if err := s.dp.DelPod(p); err != nil {
			s.log.Error("removing an unclaimed pod namespace", "netns", ns, "err", err)
			errs = append(errs, err)
		}
	}
	return errs
}

func sortedPods(pods map[string]*pod) []*pod {
	out := make([]*pod, 0, len(pods))
	for _, p := range pods {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *pod) int { return a.ip.Compare(b.ip) })
	return out
}

func ptr[T any](v T) *T { return &v }
