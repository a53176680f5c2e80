package pod

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// sandboxInput is what the per-OS builders of a container's sandbox.Spec
// (buildSandbox, in sandbox_<os>.go) know about the container.
type sandboxInput struct {
	Pod       *runtimev1.PodSpec
	Container *runtimev1.ContainerSpec
	// PodDir is <data>/pods/<uid>; Root the container's root directory
	// (for `image: native`, its private directory).
	PodDir string
	Root   string
	// Native: `image: native` (the host's view).
	Native bool
	// Writable and ReadOnly are the host paths of the container's volumes.
	Writable []string
	ReadOnly []string
	// WritableTargets and ReadOnlyTargets are the volumes' mountPaths.
	WritableTargets []string
	ReadOnlyTargets []string

	// Linux: the image, the pod's id range (host id of the pod's root)
	// and the container's overlay directories.
	Image      *image.Image
	IDBase     uint32
	Upper      string
	Work       string
	Hostname   string
	Identity   identity
	SeccompDir string
	// PodUserNS is the pod's own user namespace (a runtime that is not
	// root, with a pod network): its shims run in it, so a container
	// makes none of its own.
	PodUserNS string
}

// refuse keeps container c waiting with the kubelet's
// CreateContainerConfigError and msg (the field and the fix) until the
// pod changes or stops; it never starts.
func (p *managedPod) refuse(ctx context.Context, c *container, msg string) outcome {
	p.update(func() {
		c.state = containerState{Waiting: &waiting{Reason: "CreateContainerConfigError", Message: msg}}
	})
	p.event(warning, "Failed", c.name, "Error: "+msg)
	for {
		if out, ok := p.sleep(ctx, c, time.Hour); !ok {
			return out
		}
	}
}

func hasEnv(env []string, name string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// etcFiles are the files the kubelet manages in every container of a
// pod: /etc/hosts (written per pod), /etc/hostname, and the node's
// /etc/resolv.conf where the pod has none of its own (ms has the mounts
// so far).
func (p *managedPod) etcFiles(hostname, podIP string, ms []mounts.Mount) ([]mounts.Mount, error) {
	var out []mounts.Mount
	has := func(t string) bool {
		for _, m := range ms {
			if m.Target == t {
				return true
			}
		}
		return false
	}
	if !has("/etc/hosts") {
		p.mu.Lock()
		aliases := hostAliases(p.spec.GetHostAliases())
		p.mu.Unlock()
		src := "/etc/hosts"
		var body string
		switch {
		case podIP != "":
			body = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
				"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
				podIP + "\t" + hostname + "\n" + aliases
		case aliases != "":
			// A pod in the node's network: the node's file, then its
			// aliases, as the kubelet writes it.
			node, err := os.ReadFile("/etc/hosts")
			if err != nil {
				return nil, err
			}
			body = "# Kubernetes-managed hosts file (host network).\n" + string(node) + aliases
		}
		if body != "" {
			src = filepath.Join(p.dir, "etc-hosts")
			if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
				return nil, err
			}
		}
		out = append(out, mounts.Mount{Source: src, Target: "/etc/hosts"})
	}
	if !has("/etc/hostname") {
		src := filepath.Join(p.dir, "etc-hostname")
		if err := os.WriteFile(src, []byte(hostname+"\n"), 0o644); err != nil {
			return nil, err
		}
		out = append(out, mounts.Mount{Source: src, Target: "/etc/hostname"})
	}
	if !has("/etc/resolv.conf") {
		out = append(out, mounts.Mount{Source: "/etc/resolv.conf", Target: "/etc/resolv.conf", ReadOnly: true})
	}
	return out, nil
}

// hostAliases are the /etc/hosts lines of spec.hostAliases, under the
// kubelet's heading; "" for none.
func hostAliases(list []*runtimev1.HostAlias) string {
	if len(list) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n# Entries added by HostAliases.\n")
	for _, a := range list {
		b.WriteString(a.GetIp() + "\t" + strings.Join(a.GetHostnames(), "\t") + "\n")
	}
	return b.String()
}

// ownVolumes gives the pod's emptyDir and files volumes to the pod's root
// (the host id of its range), and to its fsGroup when it has one, as the
// kubelet does for a pod in a user namespace (group, group-writable,
// setgid on an emptyDir so new files join the group).
func (p *managedPod) ownVolumes(spec *runtimev1.PodSpec) error {
	for _, v := range spec.GetVolumes() {
		if err := p.ownVolume(spec, v); err != nil {
			return err
		}
	}
	return nil
}

// ownVolume gives volume v of pod spec to the pod (after a files volume
// was rewritten too); nothing before the pod has its id range.
func (p *managedPod) ownVolume(spec *runtimev1.PodSpec, v *runtimev1.Volume) error {
	base := slotBase(p.idSlot.Load())
	if base == 0 {
		return nil
	}
	uid, gid := int(base), int(base)
	for _, c := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		if sc := c.GetSecurityContext(); sc != nil && sc.FsGroup != nil {
			gid += int(sc.GetFsGroup()) // the pod's: the same in every container
			break
		}
	}
	dir := p.m.dirs().PodVolumeDir(p.uid, v.GetName())
	switch {
	case v.GetEmptyDir() != nil:
		if err := os.Chown(dir, uid, gid); err != nil {
			return fmt.Errorf("give volume %s to the pod: %w", v.GetName(), err)
		}
		mode := os.FileMode(0o777)
		if gid != uid {
			mode |= os.ModeSetgid
		}
		return os.Chmod(dir, mode)
	case v.GetFiles() != nil:
		return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, uid, gid)
		})
	}
	return nil
}

// rootlessOwners is what ownVolume does as root, for a rootless
// runtime's init to do inside the pod's user namespace: the pod's fsGroup
// on its emptyDir and files volumes (without fsGroup they are the pod
// root's already: the runtime's own files).
func (p *managedPod) rootlessOwners(spec *runtimev1.PodSpec) []sandbox.Own {
	var gid *int64
	for _, c := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		if sc := c.GetSecurityContext(); sc != nil && sc.FsGroup != nil {
			gid = sc.FsGroup
			break
		}
	}
	if gid == nil {
		return nil
	}
	var out []sandbox.Own
	for _, v := range spec.GetVolumes() {
		if v.GetEmptyDir() != nil || v.GetFiles() != nil {
			out = append(out, sandbox.Own{Path: p.m.dirs().PodVolumeDir(p.uid, v.GetName()), GID: uint32(*gid), Setgid: v.GetEmptyDir() != nil})
		}
	}
	return out
}

// addMounts records the container's mounts, writable and read-only, as
// host paths and as the container's paths.
func (in *sandboxInput) addMounts(ms []mounts.Mount) {
	for _, m := range ms {
		if m.ReadOnly {
			in.ReadOnly = append(in.ReadOnly, m.Source)
			in.ReadOnlyTargets = append(in.ReadOnlyTargets, m.Target)
		} else {
			in.Writable = append(in.Writable, m.Source)
			in.WritableTargets = append(in.WritableTargets, m.Target)
		}
	}
}

// podHostname is the pod's hostname: spec.hostname, else its name.
func podHostname(spec *runtimev1.PodSpec) string {
	if h := spec.GetHostname(); h != "" {
		return h
	}
	return spec.GetName()
}
