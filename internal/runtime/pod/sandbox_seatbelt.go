package pod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox/seatbelt"
)

// daemonIdentity is the user every darwin pod runs as: the runtime daemon's own
// (there is no per-pod uid on darwin; see docs/runtime.md, "darwin:
// Seatbelt").
type daemonIdentity struct {
	UID, GID int
	Groups   []int
}

// seatbeltPod describes a container for its Seatbelt profile (darwin's
// buildSandbox renders it), refusing what darwin cannot honour with the
// field named. It is OS-independent so that it is tested everywhere.
func seatbeltPod(in sandboxInput, id daemonIdentity) (seatbelt.Pod, error) {
	if err := checkDarwinSecurity(in, id); err != nil {
		return seatbelt.Pod{}, err
	}
	network, err := seatbelt.NetworkFromAnnotations(in.Pod.GetAnnotations())
	if err != nil {
		return seatbelt.Pod{}, err
	}
	if in.Pod.GetHostNetwork() {
		if v, ok := in.Pod.GetAnnotations()[seatbelt.NetworkAnnotation]; ok && v != "allow" {
			return seatbelt.Pod{}, fmt.Errorf("spec.hostNetwork: true asks for the network, which annotation %s: %q refuses: remove one of them", seatbelt.NetworkAnnotation, v)
		}
		network = true
	}

	// Seatbelt matches resolved paths: resolve every symlink first
	// (/var is /private/var).
	podDir, err := canonical(in.PodDir)
	if err != nil {
		return seatbelt.Pod{}, err
	}
	root, err := canonical(in.Root)
	if err != nil {
		return seatbelt.Pod{}, err
	}
	p := seatbelt.Pod{
		DataDir:               filepath.Dir(filepath.Dir(podDir)),
		PodDir:                podDir,
		Root:                  root,
		ReadOnlyRoot:          in.Container.GetSecurityContext().GetReadOnlyRootFilesystem(),
		Network:               network,
		NoPrivilegeEscalation: noPrivilegeEscalation(in),
	}
	for _, v := range []struct {
		in  []string
		out *[]string
	}{{in.Writable, &p.Writable}, {in.ReadOnly, &p.ReadOnly}} {
		for _, path := range v.in {
			c, err := canonical(path)
			if err != nil {
				return seatbelt.Pod{}, err
			}
			*v.out = append(*v.out, c)
		}
	}
	if in.Pod.GetResolvConf() != "" {
		p.ReadFiles = append(p.ReadFiles, datadir.New(p.DataDir).PodResolvConf(filepath.Base(podDir)))
	}
	return p, nil
}

// noPrivilegeEscalation: allowPrivilegeEscalation is false (unset means
// allowed, as upstream).
func noPrivilegeEscalation(in sandboxInput) bool {
	sc := in.Container.GetSecurityContext()
	return sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
}

// checkDarwinSecurity refuses the pod and securityContext fields darwin
// cannot honour, naming each and what to do; the others are honoured by
// the profile (readOnlyRootFilesystem, allowPrivilegeEscalation) or hold
// by construction (every pod runs as k3sm's non-root user, with no
// capabilities).
func checkDarwinSecurity(in sandboxInput, id daemonIdentity) error {
	if in.Pod.GetHostPid() {
		return errors.New("spec.hostPID: k3sm does not share the node's processes with a pod: remove hostPID")
	}
	if in.Pod.GetHostIpc() {
		return errors.New("spec.hostIPC: k3sm does not share the node's IPC with a pod: remove hostIPC")
	}
	sc := in.Container.GetSecurityContext()
	if sc == nil {
		return nil
	}
	ours := append([]int{id.GID}, id.Groups...)
	switch {
	case sc.GetPrivileged():
		return errors.New("securityContext.privileged: a darwin pod always runs under its Seatbelt profile and cannot be privileged: remove privileged")
	case len(sc.GetCapabilitiesAdd()) > 0:
		return fmt.Errorf("securityContext.capabilities.add %v: darwin has no capabilities to give a pod: remove them", sc.GetCapabilitiesAdd())
	case sc.RunAsUser != nil && sc.GetRunAsUser() != int64(id.UID):
		return fmt.Errorf("securityContext.runAsUser %d: darwin pods run as k3sm's own user (uid %d), with no user per pod: remove runAsUser or set it to %d", sc.GetRunAsUser(), id.UID, id.UID)
	case sc.RunAsGroup != nil && sc.GetRunAsGroup() != int64(id.GID):
		return fmt.Errorf("securityContext.runAsGroup %d: darwin pods run with k3sm's own group (gid %d): remove runAsGroup or set it to %d", sc.GetRunAsGroup(), id.GID, id.GID)
	case sc.GetRunAsNonRoot() && id.UID == 0:
		return errors.New("securityContext.runAsNonRoot: this node runs pods as root (k3sm's own uid is 0): run k3sm as its _k3sm user, or remove runAsNonRoot")
	case sc.FsGroup != nil && sc.GetFsGroup() != int64(id.GID):
		return fmt.Errorf("securityContext.fsGroup %d: darwin volumes belong to k3sm's own group (gid %d) and cannot be given another: remove fsGroup or set it to %d", sc.GetFsGroup(), id.GID, id.GID)
	case sc.GetSeccompProfile() == "Unconfined":
		return errors.New("securityContext.seccompProfile Unconfined: a darwin pod always runs under its Seatbelt profile (the runtime default): remove it or use RuntimeDefault")
	case sc.GetSeccompProfile() != "" && sc.GetSeccompProfile() != "RuntimeDefault":
		return fmt.Errorf("securityContext.seccompProfile %s: seccomp profiles are Linux's; a darwin pod runs under its Seatbelt profile: use RuntimeDefault", sc.GetSeccompProfile())
	case sc.GetProcMount() != "" && sc.GetProcMount() != "Default":
		return fmt.Errorf("securityContext.procMount %s: darwin has no /proc to unmask: remove procMount", sc.GetProcMount())
	}
	for _, g := range sc.GetSupplementalGroups() {
		if !slices.Contains(ours, int(g)) {
			return fmt.Errorf("securityContext.supplementalGroups %d: darwin pods have k3sm's own groups %v and no others: remove it", g, ours)
		}
	}
	return nil
}

// canonical resolves every symlink in p; a missing last element (a file
// not written yet) keeps its name under its resolved directory.
func canonical(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	c, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, fs.ErrNotExist) {
		if _, lerr := os.Lstat(abs); errors.Is(lerr, fs.ErrNotExist) {
			dir, derr := filepath.EvalSymlinks(filepath.Dir(abs))
			if derr == nil {
				return filepath.Join(dir, filepath.Base(abs)), nil
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("sandbox: resolve %s: %w", p, err)
	}
	return c, nil
}
