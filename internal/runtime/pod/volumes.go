package pod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/volume"
	"google.golang.org/protobuf/proto"
)

// Volumes live in <pod>/volumes/<name>: emptyDir and files volumes are
// directories there; hostPath and local volumes are the host's own paths.
func (p *managedPod) volumeDir(name string) string { return p.m.dirs().PodVolumeDir(p.uid, name) }

// setupVolumes creates the pod's volumes once; files volumes are (re)written
// only when their content differs, so it is cheap to call again.
func (p *managedPod) setupVolumes() error {
	p.volMu.Lock()
	defer p.volMu.Unlock()
	if p.volReady {
		return nil
	}
	p.mu.Lock()
	vols := p.spec.GetVolumes()
	p.mu.Unlock()
	for _, v := range vols {
		if err := p.setupVolume(v); err != nil {
			return fmt.Errorf("volume %q: %w", v.GetName(), err)
		}
	}
	p.volReady = true
	return nil
}

func (p *managedPod) setupVolume(v *runtimev1.Volume) error {
	dir := p.volumeDir(v.GetName())
	switch {
	case v.GetEmptyDir() != nil:
		// World-writable like the kubelet's, so any user the pod runs as
		// can write; the pod directory above it is private.
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			return err
		}
		if ed := v.GetEmptyDir(); ed.GetMemory() {
			// medium: Memory is a tmpfs, as the kubelet mounts it.
			err := volume.MountTmpfs(dir, ed.GetSizeLimitBytes())
			if errors.Is(err, volume.ErrNoTmpfs) {
				// Said, not hidden: the files are on disk, not in memory.
				p.event(warning, "EmptyDirOnDisk", "", fmt.Sprintf("emptyDir %q of medium Memory is a directory on disk: %v", v.GetName(), err))
				return nil
			}
			return err
		}
		return nil
	case v.GetFiles() != nil:
		_, err := volume.WriteAtomic(dir, volumeFiles(v.GetFiles()))
		return err
	case v.GetHostPath() != nil:
		return volume.CheckHostPath(v.GetHostPath().GetPath(), v.GetHostPath().GetType())
	case v.GetLocalPath() != nil:
		return volume.CheckHostPath(v.GetLocalPath().GetPath(), volume.HostPathDirectory)
	}
	return fmt.Errorf("no source")
}

func volumeFiles(f *runtimev1.FilesVolume) []volume.File {
	var out []volume.File
	for _, x := range f.GetFiles() {
		out = append(out, volume.File{Path: x.GetPath(), Content: x.GetContent(), Mode: os.FileMode(x.GetMode())})
	}
	return out
}

// volumeSource is the host path a volume's mounts bind from.
func (p *managedPod) volumeSource(v *runtimev1.Volume) string {
	switch {
	case v.GetHostPath() != nil:
		return v.GetHostPath().GetPath()
	case v.GetLocalPath() != nil:
		return v.GetLocalPath().GetPath()
	}
	return p.volumeDir(v.GetName())
}

// containerMounts turns a container's volumeMounts into mounts, parents
// before children. Where mount namespaces exist a mount's target is its
// mountPath as the container sees it; elsewhere (darwin) it is that path
// inside the container's root (see docs/runtime.md).
func (p *managedPod) containerMounts(cspec *runtimev1.ContainerSpec, root string, env []string) ([]mounts.Mount, error) {
	if len(cspec.GetVolumeMounts()) == 0 {
		return nil, nil
	}
	if err := p.setupVolumes(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	vols := map[string]*runtimev1.Volume{}
	for _, v := range p.spec.GetVolumes() {
		vols[v.GetName()] = v
	}
	p.mu.Unlock()
	vars := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		vars[k] = v
	}
	var out []mounts.Mount
	for _, vm := range cspec.GetVolumeMounts() {
		v, ok := vols[vm.GetName()]
		if !ok {
			return nil, fmt.Errorf("volumeMount %q: the pod has no volume of that name", vm.GetName())
		}
		src := p.volumeSource(v)
		sub := vm.GetSubPath()
		if e := vm.GetSubPathExpr(); e != "" {
			sub = expand(e, vars)
		}
		if sub != "" {
			// The kubelet creates a missing subPath in writable volumes.
			s, err := volume.SubPath(src, sub, v.GetFiles() == nil)
			if err != nil {
				// The kubelet's CreateContainerConfigError: the container
				// waits and starts once the pod changes (a subPathExpr
				// whose annotation is fixed), it does not fail.
				return nil, &refusedError{fmt.Sprintf("volumeMount %q: %v", vm.GetName(), err)}
			}
			src = s
		}
		target := vm.GetMountPath()
		if !filepath.IsAbs(target) {
			target = "/" + target
		}
		target = filepath.Clean(target)
		if target == "/" {
			return nil, fmt.Errorf("volumeMount %q: mountPath / is not allowed", vm.GetName())
		}
		if !mounts.Namespaced() {
			target = filepath.Join(root, target)
		}
		// configMap, secret, downwardAPI and projected volumes are always
		// read-only, as with the kubelet.
		out = append(out, mounts.Mount{Source: src, Target: target, ReadOnly: vm.GetReadOnly() || v.GetFiles() != nil,
			IDMapped: v.GetHostPath() != nil || v.GetLocalPath() != nil})
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i].Target, "/") < strings.Count(out[j].Target, "/")
	})
	return out, nil
}

// UpdateVolumes rewrites the content of a pod's files volumes (configMap,
// secret, downwardAPI, projected) atomically; running containers see the new
// files through their mounts. It returns the names of changed volumes.
func (m *Manager) UpdateVolumes(uid string, vols []*runtimev1.Volume) ([]string, error) {
	p := m.get(uid)
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", uid, ErrNotFound)
	}
	p.volMu.Lock()
	defer p.volMu.Unlock()
	if p.volGone {
		return nil, fmt.Errorf("pod %s is being removed: %w", uid, ErrNotFound)
	}
	var changed []string
	for _, nv := range vols {
		if nv.GetFiles() == nil {
			continue
		}
		p.mu.Lock()
		spec := p.spec
		var cur *runtimev1.Volume
		for _, v := range p.spec.GetVolumes() {
			if v.GetName() == nv.GetName() {
				cur = v
			}
		}
		p.mu.Unlock()
		if cur == nil || cur.GetFiles() == nil {
			return changed, &InvalidSpecError{fmt.Sprintf("pod %s: no files volume %q", uid, nv.GetName())}
		}
		if p.volReady {
			ch, err := volume.WriteAtomic(p.volumeDir(nv.GetName()), volumeFiles(nv.GetFiles()))
			if err == nil {
				err = p.ownVolume(spec, nv)
			}
			if err != nil {
				return changed, fmt.Errorf("volume %q: %w", nv.GetName(), err)
			}
			if ch {
				changed = append(changed, nv.GetName())
			}
		}
		p.mu.Lock()
		cur.Source = proto.Clone(nv).(*runtimev1.Volume).Source
		p.mu.Unlock()
	}
	return changed, p.save()
}

// enter makes a command run in a container: through its sandbox when it
// runs in one (the returned dir is "/": the command starts in the
// container's root, at dir), else in its mount namespace. tty is the
// terminal device the command will have ("" none): darwin's profile then
// allows that one terminal (sandbox.WithTTY).
func (m *Manager) enter(sandboxed bool, stateDir string, pid int, dir string, argv []string, tty string) ([]string, string, error) {
	if sandboxed && pid > 0 {
		if m.cfg.ShimPath == "" {
			return nil, "", errors.New("enter the container's sandbox: the runtime has no shim path")
		}
		return sandbox.EnterArgv(m.cfg.ShimPath, stateDir, dir, argv), "/", nil
	}
	if runtime.GOOS == "darwin" && stateDir != "" {
		// The container's Seatbelt profile wraps its execs too.
		if att, err := sandbox.ReadAttempt(stateDir, false); err == nil {
			spec := att.Sandbox
			if tty != "" {
				if spec, err = sandbox.WithTTY(spec, tty); err != nil {
					return nil, "", err
				}
			}
			argv = sandbox.WrapArgv(spec, argv)
		}
	}
	return inContainerMounts(pid, dir, argv)
}

// inContainerMounts makes a command run in the mount namespace of container
// process pid, so exec, exec probes and exec hooks see the container's
// volumes. The returned dir is where to start the command from.
func inContainerMounts(pid int, dir string, argv []string) ([]string, string, error) {
	if pid <= 0 {
		return argv, dir, nil
	}
	wrapped, err := mounts.EnterArgv(pid, dir, argv)
	if err != nil {
		return nil, "", err
	}
	if len(wrapped) != len(argv) {
		// The working directory may exist only inside the namespace.
		return wrapped, "/", nil
	}
	return wrapped, dir, nil
}

// enforceEmptyDirLimits evicts a pod whose emptyDir uses more than its
// sizeLimit, as the kubelet's eviction manager does (no grace period).
func (m *Manager) enforceEmptyDirLimits(ctx context.Context) {
	every := m.cfg.EmptyDirCheckInterval
	if every <= 0 {
		every = 10 * time.Second
	}
	m.everyPod(ctx, every, func(p *managedPod) {
		if msg := p.emptyDirOverLimit(); msg != "" {
			m.evict(p, msg)
		}
	})
}

// emptyDirOverLimit returns the kubelet's eviction message for the first
// emptyDir above its sizeLimit, or "".
func (p *managedPod) emptyDirOverLimit() string {
	p.mu.Lock()
	if p.terminating || p.evicted != "" {
		p.mu.Unlock()
		return ""
	}
	// Read under mu: UpdateVolumes replaces a volume's source in place.
	type limited struct {
		name  string
		limit int64
	}
	var vols []limited
	for _, v := range p.spec.GetVolumes() {
		if l := v.GetEmptyDir().GetSizeLimitBytes(); l > 0 {
			vols = append(vols, limited{v.GetName(), l})
		}
	}
	p.mu.Unlock()
	p.volMu.Lock()
	ready := p.volReady
	p.volMu.Unlock()
	if !ready {
		return ""
	}
	for _, v := range vols {
		used, err := volume.Usage(p.volumeDir(v.name))
		if err == nil && used > v.limit {
			return fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", v.name, binaryQuantity(v.limit))
		}
	}
	return ""
}

// evict stops every container at once and leaves the pod Failed with reason
// Evicted until it is deleted.
func (m *Manager) evict(p *managedPod, msg string) { m.fail(p, "", msg, true) }

// writeResolvConf writes the pod's resolv.conf when the provider rendered
// one ("" otherwise). Written once per content: containers share it.
func (p *managedPod) writeResolvConf(spec *runtimev1.PodSpec) (string, error) {
	rc := spec.GetResolvConf()
	if rc == "" {
		return "", nil
	}
	path := p.m.dirs().PodResolvConf(p.uid)
	if b, err := os.ReadFile(path); err != nil || string(b) != rc {
		if err := atomicfile.WriteFileNoSync(path, []byte(rc), 0o644); err != nil {
			return "", fmt.Errorf("pod resolv.conf: %w", err)
		}
	}
	return path, nil
}

// resolvConf gives a container the pod's resolver configuration: on Linux
// a read-only mount over /etc/resolv.conf in its mount namespace (as the
// kubelet's); on darwin, which has no mount namespaces and whose resolver
// never reads /etc/resolv.conf, the environment that loads the getaddrinfo
// interposer and points it at the file (see dnsShimEnv).
func (p *managedPod) resolvConf(spec *runtimev1.PodSpec) (m *mounts.Mount, env []string, err error) {
	path, err := p.writeResolvConf(spec)
	if err != nil || path == "" {
		return nil, nil, err
	}
	if mounts.Namespaced() {
		return &mounts.Mount{Source: path, Target: "/etc/resolv.conf", ReadOnly: true}, nil, nil
	}
	if lib := p.m.cfg.DNSShimLib; lib != "" {
		if _, err := os.Stat(lib); err == nil {
			return nil, dnsShimEnv(lib, path), nil
		}
	}
	return nil, nil, nil
}
