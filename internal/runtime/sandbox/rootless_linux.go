//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
)

// Available reports whether the sandbox can be used here: as root, or
// without root where an unprivileged user namespace can be made (the
// rootless sandbox: see Rootless).
func Available() bool { return os.Geteuid() == 0 || mounts.Namespaced() }

// Rootless reports whether the sandbox is the rootless one: the runtime
// is not root, so a pod's user namespace maps the runtime's own uid as its
// root (and its subordinate ids, see RootlessIDs), and the container's
// init builds the root itself, inside that namespace.
func Rootless() bool { return os.Geteuid() != 0 }

var (
	rootlessOnce             sync.Once
	rootlessUID, rootlessGID []IDMap
	rootlessWhy              string
)

// RootlessIDs returns the maps of a rootless pod's user namespace and,
// when they hold only the pod's root (no subordinate range for the
// runtime's user, or no newuidmap/newgidmap), why and how to fix it.
func RootlessIDs() (uid, gid []IDMap, why string) {
	rootlessOnce.Do(func() {
		euid, egid := os.Geteuid(), os.Getegid()
		name := userName(euid)
		subU, subG := uint32(0), uint32(0)
		if f, err := os.Open("/etc/subuid"); err == nil {
			subU, _ = SubordinateRange(f, name, euid, PodIDs-1)
			f.Close()
		}
		if f, err := os.Open("/etc/subgid"); err == nil {
			subG, _ = SubordinateRange(f, name, euid, PodIDs-1)
			f.Close()
		}
		_, errU := lookTool("newuidmap")
		_, errG := lookTool("newgidmap")
		switch {
		case subU == 0 || subG == 0:
			rootlessWhy = fmt.Sprintf("%s (uid %d) has no subordinate range of 65536 ids in /etc/subuid and /etc/subgid", name, euid)
		case errU != nil || errG != nil:
			rootlessWhy = "newuidmap or newgidmap is not on $PATH"
		}
		if rootlessWhy != "" {
			rootlessWhy += ", so a pod's user namespace has only its root (id 0, which is " + name + "); to fix: " + RangeHint(name)
			subU, subG = 0, 0
		}
		rootlessUID, rootlessGID = RootlessMaps(uint32(euid), subU), RootlessMaps(uint32(egid), subG)
	})
	return rootlessUID, rootlessGID, rootlessWhy
}

// writeMaps writes the user namespace maps of process pid with shadow's
// setuid helpers, which check them against /etc/subuid and /etc/subgid.
func writeMaps(pid int, spec *Spec) error {
	for _, m := range []struct {
		tool string
		maps []IDMap
	}{{"newuidmap", spec.UIDMap}, {"newgidmap", spec.GIDMap}} {
		path, err := lookTool(m.tool)
		if err != nil {
			return err
		}
		out, err := exec.Command(path, append([]string{strconv.Itoa(pid)}, mapArgs(m.maps)...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("write the pod's user namespace map with %s: %v: %s", m.tool, err, out)
		}
	}
	return nil
}

// lookTool finds a system tool on $PATH, else where Debian installs it:
// the shim runs with a minimal environment.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (Debian: apt install uidmap)", name)
}
