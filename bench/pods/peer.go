package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	kubeconfigpkg "github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/pki"
)

// The peer: an upstream kubelet with containerd and runc, joined as a
// second node to the real server's control plane. Everything it has is
// private to the run: its directories under the work dir, a mount
// namespace of its own (containerd's and the kubelet's mounts, the pods'
// network namespace files and shim sockets vanish with it), the cgroup
// subtree peerCgroupRoot, its node IP (on lo of the benchmark's own
// network namespace: the kubelet refuses a loopback node IP, and a dummy
// link needs a module a container may lack), and the pods' bridge.
const (
	peerNodeName   = "bench-peer"
	peerCgroupRoot = "k3sm-bench-peer"
	peerBridge     = "k3smpeer-br" // the pods' bridge (cni0 in a kubeadm cluster)
	// peerNodeIP is in TEST-NET-1 (RFC 5737): never routed, and only ever
	// assigned inside the benchmark's network namespace.
	peerNodeIP = "192.0.2.1"
)

// peerBins are the programs the peer runs.
type peerBins struct {
	dir                                    string
	kubelet, containerd, shim, runc, pause string
	cniDir                                 string
}

// peer is the running kubelet + containerd.
type peer struct {
	bins          peerBins
	dir           string
	containerd    *exec.Cmd
	kubelet       *exec.Cmd
	cdWait, kWait chan error
	versions      string
	addrAdded     bool
}

// peerBinDirs lists where peer binaries are looked for, best first: dir
// (the -peer-bin flag), what bench/peer-bin.sh builds, and the binaries
// klimax's node-image builder caches (`make node-image`).
func peerBinDirs(dir string) []string {
	if dir != "" {
		return []string{dir}
	}
	dirs := []string{"_output/bench/peer-bin"}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if h, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(h, ".cache")
		}
	}
	found, _ := filepath.Glob(filepath.Join(cache, "klimax", "node-image", "bin-*"))
	// Newest first: an older key's directory is what prune leaves behind.
	sort.Slice(found, func(i, j int) bool { return modTime(found[i]).After(modTime(found[j])) })
	return append(dirs, found...)
}

func modTime(p string) time.Time {
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// findPeer checks everything the peer needs and says what is missing and
// how to get it.
func findPeer(binDir string) (peerBins, error) {
	if os.Geteuid() != 0 {
		return peerBins{}, errors.New("the peer (kubelet + containerd) needs root: run `sudo bench/run.sh pods`")
	}
	if err := ownNetNS(); err != nil {
		return peerBins{}, err
	}
	var b peerBins
	var tried []string
	for _, d := range peerBinDirs(binDir) {
		abs, _ := filepath.Abs(d)
		if executable(filepath.Join(abs, "kubelet")) && executable(filepath.Join(abs, "containerd")) && executable(filepath.Join(abs, "containerd-shim-runc-v2")) {
			b.dir = abs
			break
		}
		tried = append(tried, d)
	}
	if b.dir == "" {
		return b, fmt.Errorf("no kubelet, containerd and containerd-shim-runc-v2 (looked in %s): build them with `bench/peer-bin.sh` "+
			"(or `make node-image`, whose cache has them), or pass -peer-bin DIR", strings.Join(tried, ", "))
	}
	b.kubelet, b.containerd, b.shim = filepath.Join(b.dir, "kubelet"), filepath.Join(b.dir, "containerd"), filepath.Join(b.dir, "containerd-shim-runc-v2")
	if p := filepath.Join(b.dir, "pause"); executable(p) {
		b.pause = p
	}
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if executable(p) {
			b.runc = p
			break
		}
	}
	if b.runc == "" {
		return b, errors.New("no runc: install Debian's package (`apt-get install -y runc`)")
	}
	for _, d := range []string{"/usr/lib/cni", "/opt/cni/bin"} {
		if executable(filepath.Join(d, "bridge")) && executable(filepath.Join(d, "host-local")) && executable(filepath.Join(d, "loopback")) {
			b.cniDir = d
			break
		}
	}
	if b.cniDir == "" {
		return b, errors.New("no CNI plugins (bridge, host-local, loopback in /usr/lib/cni or /opt/cni/bin): `apt-get install -y containernetworking-plugins`")
	}
	for _, tool := range []string{"ip", "unshare", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return b, fmt.Errorf("the peer needs %s (iproute2, util-linux): %v", tool, err)
		}
	}
	return b, nil
}

// ownNetNS refuses the machine's network namespace: this one must differ
// from PID 1's or, where PID 1's cannot be read (a container), have no
// link but lo (what `unshare --net` gives; checked before the servers add
// theirs).
func ownNetNS() error {
	refuse := "refusing to start the peer in the machine's network namespace (it adds an address, a bridge and pod networks): " +
		"run through `bench/run.sh pods`, which runs bench/pods in a network namespace of its own"
	self, err1 := os.Readlink("/proc/self/ns/net")
	init, err2 := os.Readlink("/proc/1/ns/net")
	if err1 == nil && err2 == nil {
		if self == init {
			return errors.New(refuse)
		}
		return nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("list network links: %w", err)
	}
	var names []string
	for _, i := range ifs {
		if i.Name != "lo" {
			names = append(names, i.Name)
		}
	}
	if len(names) > 0 {
		return fmt.Errorf("%s (PID 1's namespace cannot be read here, and this one has links %s)", refuse, strings.Join(names, ", "))
	}
	return nil
}

// cgroupMounts lists the mount points of the machine's cgroup hierarchies
// (v1 controllers, named hierarchies, the v2 tree).
func cgroupMounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(pre), strings.Fields(post)
		if len(f) >= 5 && len(pf) >= 1 && (pf[0] == "cgroup" || pf[0] == "cgroup2") {
			out = append(out, f[4])
		}
	}
	return out
}

// makeCgroupRoot creates peerCgroupRoot in every hierarchy (the kubelet
// refuses a cgroupRoot that does not exist), its cpuset filled from the
// parent's as a v1 cpuset must be before a process can join.
func makeCgroupRoot() error {
	for _, m := range cgroupMounts() {
		d := filepath.Join(m, peerCgroupRoot)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(m, f)); err == nil {
				if cur, _ := os.ReadFile(filepath.Join(d, f)); strings.TrimSpace(string(cur)) == "" {
					if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
						return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
					}
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills what is left in peerCgroupRoot and removes it,
// deepest first, in every hierarchy.
func removeCgroupRoot() []string {
	var left []string
	for _, m := range cgroupMounts() {
		root := filepath.Join(m, peerCgroupRoot)
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for range 50 {
				if rmdirCgroup(dirs[i]) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if _, err := os.Stat(dirs[i]); err == nil {
				left = append(left, dirs[i])
			}
		}
	}
	return left
}

func rmdirCgroup(d string) bool {
	b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	err := syscall.Rmdir(d)
	return err == nil || errors.Is(err, syscall.ENOENT)
}

func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// containerdConfig is a containerd 2 configuration whose every path is
// under dir: nothing of the machine's containerd (Docker's) is shared.
func containerdConfig(dir string, b peerBins, sandboxImage string) string {
	q := strconv.Quote
	return `version = 3
root = ` + q(filepath.Join(dir, "containerd", "root")) + `
state = ` + q(filepath.Join(dir, "containerd", "state")) + `
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = ` + q(filepath.Join(dir, "containerd.sock")) + `
[ttrpc]
  address = ` + q(filepath.Join(dir, "containerd.sock.ttrpc")) + `

[plugins.'io.containerd.internal.v1.opt']
  path = ` + q(filepath.Join(dir, "containerd", "opt")) + `

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = ` + q(sandboxImage) + `
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = ` + q(filepath.Join(dir, "certs.d")) + `

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = ` + strconv.FormatBool(!hasCapSysResource()) + `
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = ` + q(b.runc) + `
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [` + q(b.cniDir) + `]
    conf_dir = ` + q(filepath.Join(dir, "cni")) + `

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`
}

// hasCapSysResource says whether this process may lower an OOM score
// (CAP_SYS_RESOURCE). Without it (a container's root) runc fails to start
// any container whose oomScoreAdj is below its parent's, as the kubelet
// asks for the sandbox; containerd then caps the score at its own, as
// klimax's node image does in such engines.
func hasCapSysResource() bool {
	const capSysResource = 24
	v := procField("/proc/self/status", "CapEff", ":")
	caps, err := strconv.ParseUint(v, 16, 64)
	return err == nil && caps&(1<<capSysResource) != 0
}

// registryHosts lets containerd pull from the benchmark's plain-HTTP
// loopback registry.
func registryHosts(registry string) string {
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+registry, "http://"+registry)
}

// kubeletConfig is a KubeletConfiguration as kubeadm would leave it, but
// on its own ports, cgroup subtree and log directory, with eviction
// thresholds that a shared disk cannot trip, and verifying (not changing)
// the kernel settings the kubelet wants.
func kubeletConfig(dir, caFile string, port, healthz int, clusterDNS string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /%s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
containerRuntimeEndpoint: unix://%s
podLogsDir: %q
clusterDNS: [%q]
clusterDomain: cluster.local
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.available: "1%%"} # benchEviction
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
rotateCertificates: false
serverTLSBootstrap: false
`, port, healthz, caFile, peerCgroupRoot, filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "pod-logs"), clusterDNS)
}

// cniConfig is a bridge network over the node's podCIDR, as a kubeadm
// cluster's simplest CNI would give.
func cniConfig(dir, podCIDR string) string {
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench-peer", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}
]}
`, peerBridge, podCIDR, filepath.Join(dir, "cni-ipam"))
}

// startPeer starts containerd and the kubelet, joins the kubelet to cp's
// control plane as peerNodeName and waits until the node is Ready.
func startPeer(ctx context.Context, b peerBins, work string, cp *server, registry string) (p *peer, err error) {
	p = &peer{bins: b, dir: filepath.Join(work, "peer")}
	defer func() {
		if err != nil {
			err = fmt.Errorf("peer: %w (logs in %s)", err, p.dir)
		}
	}()
	for _, d := range []string{"cni", "certs.d/" + registry, "pod-logs", "kubelet", "pki"} {
		if err := os.MkdirAll(filepath.Join(p.dir, d), 0o700); err != nil {
			return p, err
		}
	}
	vk, _ := exec.Command(b.kubelet, "--version").Output()
	vc, _ := exec.Command(b.containerd, "--version").Output()
	vr, _ := exec.Command(b.runc, "--version").Output()
	p.versions = fmt.Sprintf("kubelet %s, containerd %s (from %s), runc %s", field(string(vk), 1),
		field(string(vc), 2), relPath(b.dir), field(string(vr), 2))

	pause := b.pause
	if pause == "" {
		pause = filepath.Join(p.dir, "pause")
		build := exec.Command("go", "build", "-o", pause, "./internal/klimax/nodeimage/cmd/pause")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return p, fmt.Errorf("build the pause program (from the repository root): %v: %s", err, out)
		}
	}
	sandbox, err := pushPause(registry, pause)
	if err != nil {
		return p, err
	}

	// Identity: a client certificate of the server's client CA, as
	// kubeadm join would obtain through the CSR.
	l := datadir.New(cp.dir)
	if _, err := os.Stat(l.TLS("client-ca.key")); err != nil {
		return p, fmt.Errorf("the real server's client CA: %w", err)
	}
	ca, err := pki.LoadOrCreateCA(l.TLSDir(), "client-ca", "k3sm-client-ca")
	if err != nil {
		return p, err
	}
	leaf, err := ca.Ensure(filepath.Join(p.dir, "pki"), "kubelet-client", pki.LeafSpec{
		CommonName: "system:node:" + peerNodeName, Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		return p, err
	}
	kubeconfig := filepath.Join(p.dir, "kubelet.kubeconfig")
	serverCA, err := os.ReadFile(l.TLS("server-ca.crt"))
	if err != nil {
		return p, fmt.Errorf("the real server's CA: %w", err)
	}
	if err := kubeconfigpkg.WriteClient(kubeconfig, cp.rc.Host, serverCA, leaf, peerNodeName); err != nil {
		return p, err
	}

	if err := runCmd("ip", "addr", "add", peerNodeIP+"/32", "dev", "lo"); err != nil {
		return p, err
	}
	p.addrAdded = true
	if err := makeCgroupRoot(); err != nil {
		return p, err
	}

	cfg := filepath.Join(p.dir, "containerd.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(p.dir, b, sandbox)), 0o600); err != nil {
		return p, err
	}
	if err := os.WriteFile(filepath.Join(p.dir, "certs.d", registry, "hosts.toml"), []byte(registryHosts(registry)), 0o600); err != nil {
		return p, err
	}
	// containerd in a mount namespace of its own: tmpfs over /run/containerd
	// (shim sockets) and /run/netns (the pods' network namespace files), so
	// whatever is left when it dies goes with the namespace.
	p.containerd = exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
		`mkdir -p /run/containerd /run/netns && mount -t tmpfs -o mode=0711 tmpfs /run/containerd && `+
			`mount -t tmpfs -o mode=0755 tmpfs /run/netns && exec "$0" "$@"`, b.containerd, "--config", cfg)
	p.containerd.Env = append(os.Environ(), "PATH="+b.dir+":/usr/sbin:/usr/bin:/sbin:/bin")
	if p.cdWait, err = startLogged(p.containerd, filepath.Join(p.dir, "containerd.log")); err != nil {
		return p, err
	}
	err = poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		if err := exited(p.cdWait); err != nil {
			return errStop{fmt.Errorf("containerd exited: %v; log:\n%s", err, tailFile(filepath.Join(p.dir, "containerd.log"), 20))}
		}
		_, err := os.Stat(filepath.Join(p.dir, "containerd.sock"))
		return err
	})
	if err != nil {
		return p, err
	}

	ports, err := freePorts(2)
	if err != nil {
		return p, err
	}
	kcfg := filepath.Join(p.dir, "kubelet.yaml")
	if err := os.WriteFile(kcfg, []byte(kubeletConfig(p.dir, ca.CertPath, ports[0], ports[1], "10.43.0.10")), 0o600); err != nil {
		return p, err
	}
	// The kubelet shares containerd's mount namespace: containerd must see
	// the volumes the kubelet mounts.
	p.kubelet = exec.Command("nsenter", "--mount=/proc/"+strconv.Itoa(p.containerd.Process.Pid)+"/ns/mnt", "--",
		b.kubelet, "--config", kcfg, "--kubeconfig", kubeconfig, "--root-dir", filepath.Join(p.dir, "kubelet"),
		"--hostname-override", peerNodeName, "--node-ip", peerNodeIP, "--v", "1")
	p.kubelet.Env = p.containerd.Env
	if p.kWait, err = startLogged(p.kubelet, filepath.Join(p.dir, "kubelet.log")); err != nil {
		return p, err
	}
	fmt.Printf("bench/pods: peer: %s started, waiting for node %s\n", p.versions, peerNodeName)

	// The controller-manager allocates the node's podCIDR; the bridge
	// network is written for it, and the node turns Ready once containerd
	// sees a CNI configuration.
	var node *corev1.Node
	err = poll(ctx, 2*time.Minute, 200*time.Millisecond, func() error {
		if err := exited(p.kWait); err != nil {
			return errStop{fmt.Errorf("kubelet exited: %v; log:\n%s", err, tailFile(filepath.Join(p.dir, "kubelet.log"), 30))}
		}
		node, err = cp.c.CoreV1().Nodes().Get(ctx, peerNodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Spec.PodCIDR == "" {
			return errors.New("no podCIDR allocated yet")
		}
		return nil
	})
	if err != nil {
		return p, err
	}
	if err := os.WriteFile(filepath.Join(p.dir, "cni", "10-bench-peer.conflist"), []byte(cniConfig(p.dir, node.Spec.PodCIDR)), 0o600); err != nil {
		return p, err
	}
	err = poll(ctx, 2*time.Minute, 200*time.Millisecond, func() error {
		if err := exited(p.kWait); err != nil {
			return errStop{fmt.Errorf("kubelet exited: %v; log:\n%s", err, tailFile(filepath.Join(p.dir, "kubelet.log"), 30))}
		}
		n, err := cp.c.CoreV1().Nodes().Get(ctx, peerNodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not Ready: %s", peerNodeName, c.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition", peerNodeName)
	})
	if err != nil {
		return p, err
	}
	fmt.Printf("bench/pods: peer: node %s Ready (podCIDR %s)\n", peerNodeName, node.Spec.PodCIDR)
	return p, nil
}

// errStop ends a poll early.
type errStop struct{ error }

func field(s string, i int) string {
	f := strings.Fields(s)
	if i < len(f) {
		return f[i]
	}
	return strings.TrimSpace(s)
}

// relPath shows p relative to the working directory when it is inside it.
func relPath(p string) string {
	wd, err := os.Getwd()
	if r, rerr := filepath.Rel(wd, p); err == nil && rerr == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

func tailFile(path string, lines int) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), lines)
}

func startLogged(cmd *exec.Cmd, logPath string) (chan error, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch, nil
}

// exited returns the exit error of a process that has exited (keeping it
// for later callers), nil while it runs.
func exited(ch chan error) error {
	select {
	case err := <-ch:
		ch <- err
		if err == nil {
			err = errors.New("exit status 0")
		}
		return err
	default:
		return nil
	}
}

func (p *peer) alive() error {
	if err := exited(p.kWait); err != nil {
		return fmt.Errorf("peer kubelet exited (%v); log %s:\n%s", err, filepath.Join(p.dir, "kubelet.log"), tailFile(filepath.Join(p.dir, "kubelet.log"), 30))
	}
	if err := exited(p.cdWait); err != nil {
		return fmt.Errorf("peer containerd exited (%v); log %s:\n%s", err, filepath.Join(p.dir, "containerd.log"), tailFile(filepath.Join(p.dir, "containerd.log"), 30))
	}
	return nil
}

// stop ends the kubelet, containerd and every process they left (shims,
// containers), removes the cgroup subtree, the link and the Node object.
// It reports what could not be cleaned.
func (p *peer) stop(cp *server) error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, c := range []struct {
		cmd  *exec.Cmd
		wait chan error
	}{{p.kubelet, p.kWait}, {p.containerd, p.cdWait}} {
		if c.cmd == nil || c.cmd.Process == nil || exited(c.wait) != nil {
			continue
		}
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.wait:
		case <-time.After(20 * time.Second):
			c.cmd.Process.Kill()
			<-c.wait
		}
	}
	// Shims outlive containerd by design; they and the containers are in
	// the peer's cgroups or run the peer's shim binary.
	for _, pr := range p.classify(scan()) {
		syscall.Kill(pr.Pid, syscall.SIGKILL)
	}
	if left := removeCgroupRoot(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("peer cgroups not removed: %s", strings.Join(left, ", ")))
	}
	if p.addrAdded {
		if err := runCmd("ip", "addr", "del", peerNodeIP+"/32", "dev", "lo"); err != nil {
			errs = append(errs, err)
		}
		p.addrAdded = false
	}
	exec.Command("ip", "link", "del", peerBridge).Run() // the bridge plugin's; absent if no pod ran
	if cp != nil && cp.c != nil && cp.alive() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cp.c.CoreV1().Nodes().Delete(ctx, peerNodeName, metav1.DeleteOptions{})
		cancel()
	}
	p.kubelet, p.containerd = nil, nil
	return errors.Join(errs...)
}

// classify names the peer's processes: the kubelet, containerd, the
// shims (containerd-shim-runc-v2, which re-parent away from containerd)
// and every process under a shim: pause, runc while it runs, the
// workload.
func (p *peer) classify(all []proc) []proc {
	byParent := map[int][]proc{}
	for _, pr := range all {
		byParent[pr.PPid] = append(byParent[pr.PPid], pr)
	}
	var out []proc
	var under func(pid int)
	under = func(pid int) {
		for _, c := range byParent[pid] {
			switch base := filepath.Base(c.Exe); {
			case c.Exe == p.bins.shim:
				c.Role = "containerd-shim-runc-v2"
			case base == "pause":
				c.Role = "pause"
			case base == "runc":
				c.Role = "runc"
			default:
				c.Role = "workload"
			}
			out = append(out, c)
			under(c.Pid)
		}
	}
	for _, pr := range all {
		switch {
		case p.kubelet != nil && p.kubelet.Process != nil && pr.Pid == p.kubelet.Process.Pid:
			pr.Role = "kubelet"
		case p.containerd != nil && p.containerd.Process != nil && pr.Pid == p.containerd.Process.Pid:
			pr.Role = "containerd"
		case pr.Exe == p.bins.shim:
			pr.Role = "containerd-shim-runc-v2"
		default:
			continue
		}
		out = append(out, pr)
		if pr.Role == "containerd-shim-runc-v2" {
			under(pr.Pid)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return dedup(out)
}

func dedup(ps []proc) []proc {
	var out []proc
	for i, p := range ps {
		if i == 0 || p.Pid != ps[i-1].Pid {
			out = append(out, p)
		}
	}
	return out
}

// residue lists what is left of deleted pods on the peer: shims and the
// processes under them.
func (p *peer) residue() []string {
	var left []string
	ps := p.classify(scan())
	for _, role := range []string{"containerd-shim-runc-v2", "pause", "workload"} {
		if n := countRole(ps, role); n > 0 {
			left = append(left, fmt.Sprintf("%d %s processes", n, role))
		}
	}
	return left
}
