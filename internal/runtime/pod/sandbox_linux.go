//go:build linux

package pod

import (
	"fmt"
	"os"
	"sync"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox/seccomp"
)

// Pod id ranges: pod slot n (1…idSlots) maps its ids 0…65535 to host ids
// idBase+n·65536…, a range no host account uses; slot 0 is never given.
const (
	idBase  = 1 << 30
	idRange = 1 << 16
	idSlots = 16383
)

var slotMu sync.Mutex

// slotBase is the host id of the root of the pod in slot n (0: none).
func slotBase(n int32) uint32 {
	if n <= 0 {
		return 0
	}
	return idBase + uint32(n)*idRange
}

// idRangeBase returns the host id of the pod's root, giving the pod a
// slot no other pod of the daemon has (kept in pod.json).
func (p *managedPod) idRangeBase() (uint32, error) {
	if sandbox.Rootless() {
		// Every pod's root is the runtime's own uid (RootlessIDs).
		return uint32(os.Geteuid()), nil
	}
	slotMu.Lock()
	defer slotMu.Unlock()
	if n := p.idSlot.Load(); n > 0 {
		return slotBase(n), nil
	}
	used := map[int32]bool{}
	p.m.mu.Lock()
	for _, o := range p.m.pods {
		used[o.idSlot.Load()] = true
	}
	p.m.mu.Unlock()
	for n := int32(1); n <= idSlots; n++ {
		if !used[n] {
			p.idSlot.Store(n)
			return slotBase(n), nil
		}
	}
	return 0, fmt.Errorf("no free user-namespace range: %d pods already have one", idSlots)
}

// sandboxed reports whether the container runs in the sandbox: every
// container, on a node where the sandbox is available.
func sandboxed() bool { return sandbox.Available() }

// nativeRoot is where an `image: native` container's private directory
// is in the sandbox: its working directory, HOME and K3SM_ROOT (the data
// dir that holds it is closed to the pod's ids). A path no host has, so
// mounting it hides nothing of the host's view.
const nativeRoot = "/run/k3sm-pod"

// buildSandbox returns the container's boundary: its image as "/", a
// user namespace mapping the pod's range, its identity and capabilities.
func buildSandbox(in sandboxInput) (*sandbox.Spec, error) {
	if hu := in.Pod.HostUsers; hu != nil && *hu {
		return nil, fmt.Errorf("spec.hostUsers: true is refused: k3sm runs every pod in a user namespace of its own; remove hostUsers")
	}
	sc := in.Container.GetSecurityContext()
	uidMap := []sandbox.IDMap{{ContainerID: 0, HostID: in.IDBase, Size: idRange}}
	gidMap := uidMap
	if sandbox.Rootless() {
		var why string
		uidMap, gidMap, why = sandbox.RootlessIDs()
		if err := rootlessIdentity(in.Container.GetName(), in.Identity, uidMap, gidMap, why); err != nil {
			return nil, err
		}
		if in.PodUserNS != "" {
			// The shim runs in the pod's user namespace, which has
			// these maps: the container makes none of its own.
			uidMap, gidMap = nil, nil
		}
	}
	var policy *sandbox.Landlock
	lower := ""
	if in.Native {
		// The host's view, read-only but for its volumes and private
		// directory: files the pod's ids do not own or may not read stay
		// closed, and Landlock closes the rest of the host's.
		policy = sandbox.NativePolicy("", in.WritableTargets, in.ReadOnlyTargets)
	} else {
		policy = sandbox.ImagePolicy(in.WritableTargets, sc.GetReadOnlyRootFilesystem())
		lower = in.Image.RootFS
	}
	s := &sandbox.Spec{
		Lower: lower, Upper: in.Upper, Work: in.Work, ReadOnlyRoot: sc.GetReadOnlyRootFilesystem(),
		UIDMap: uidMap, GIDMap: gidMap,
		UID: in.Identity.UID, GID: in.Identity.GID, Groups: in.Identity.Groups, Hostname: in.Hostname,
		Capabilities:    capabilities(in.Container),
		NoNewPrivileges: sc != nil && sc.AllowPrivilegeEscalation != nil && !sc.GetAllowPrivilegeEscalation(),
		Landlock:        policy,
	}
	filter, err := seccomp.ForContainer(sc.GetSeccompProfile(), in.SeccompDir, s.Capabilities)
	if err != nil {
		return nil, err
	}
	s.Seccomp = filter
	return s, nil
}

// rootlessIdentity refuses an identity the rootless maps cannot give
// (only the pod's root exists without a subordinate range; why says so).
func rootlessIdentity(ctr string, id identity, uidMap, gidMap []sandbox.IDMap, why string) error {
	check := func(field string, v uint32, maps []sandbox.IDMap) error {
		if sandbox.Covers(maps, v) {
			return nil
		}
		return fmt.Errorf("container %s: %s %d cannot be given: k3sm runs without root and %s", ctr, field, v, why)
	}
	if err := check("user (runAsUser or the image's User)", id.UID, uidMap); err != nil {
		return err
	}
	if err := check("group (runAsGroup or the image's User)", id.GID, gidMap); err != nil {
		return err
	}
	for _, g := range id.Groups {
		if err := check("supplementary group (supplementalGroups, fsGroup or /etc/group)", g, gidMap); err != nil {
			return err
		}
	}
	return nil
}

// wrapperSandbox: the boundary here is not a wrapper process.
func wrapperSandbox(in sandboxInput) (*sandbox.Spec, error) { return nil, nil }
