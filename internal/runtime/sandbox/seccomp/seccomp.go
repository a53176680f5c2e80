// Package seccomp builds the classic-BPF seccomp filters the shim loads
// before it executes a container (sandbox.Spec.Seccomp): the runtime
// default, a profile equivalent to containerd's and Docker's (the moby
// profile, github.com/moby/profiles/seccomp) with k3sm's additions, and
// Localhost profiles in the OCI/Docker JSON format. The daemon compiles;
// the shim only loads (sandbox.LoadSeccomp), so the shim links none of this.
package seccomp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// DefaultCapabilities is the capability set RuntimeDefault is built for
// (sandbox.DefaultCapabilities). The moby profile allows some calls only
// with a capability (chroot with CAP_SYS_CHROOT, mount with CAP_SYS_ADMIN,
// ...); a container with another set gets RuntimeDefaultFor.
var DefaultCapabilities = sandbox.DefaultCapabilities

// maxProfileBytes bounds a Localhost profile file (moby's default is ~20 KB).
const maxProfileBytes = 1 << 20

const field = "securityContext.seccompProfile"

func fieldErr(format string, a ...any) error {
	return fmt.Errorf(field+": "+format, a...)
}

// RuntimeDefault is the filter of seccompProfile RuntimeDefault for a
// container with DefaultCapabilities. It is compiled once per process;
// each call returns a copy.
func RuntimeDefault() ([]sandbox.SockFilter, error) {
	return RuntimeDefaultFor(DefaultCapabilities)
}

// ForContainer resolves the seccomp profile of a container whose bounding
// set is capabilities: "" or "RuntimeDefault" is RuntimeDefault, "Unconfined"
// is nil (no filter), and "Localhost/<path>" compiles the OCI/Docker-format
// JSON profile at <localhostDir>/<path>, which must stay inside
// localhostDir (no "..", no absolute path, no symlink out of it). The
// capabilities matter: the moby profile allows some calls only with a
// capability (ptrace with CAP_SYS_PTRACE, mount with CAP_SYS_ADMIN, ...),
// and a Docker-format Localhost profile's includes/excludes name them.
func ForContainer(profile, localhostDir string, capabilities []string) ([]sandbox.SockFilter, error) {
	switch profile {
	case "", "RuntimeDefault", "runtime/default", "docker/default":
		return RuntimeDefaultFor(capabilities)
	case "Unconfined", "unconfined":
		return nil, nil
	}
	rel, ok := strings.CutPrefix(profile, "Localhost/")
	if !ok {
		rel, ok = strings.CutPrefix(profile, "localhost/")
	}
	if !ok {
		return nil, fieldErr("unknown profile %q: use RuntimeDefault, Unconfined or Localhost/<path relative to the node's seccomp profile directory>", profile)
	}
	body, err := readLocalhost(rel, localhostDir)
	if err != nil {
		return nil, err
	}
	f, err := compileLocalhost(body, normCaps(capabilities))
	if err != nil {
		return nil, fieldErr("Localhost profile %s: %v", filepath.Join(localhostDir, rel), err)
	}
	return f, nil
}

// normCaps spells capabilities as the profiles do ("CAP_NET_ADMIN"),
// sorted and without repeats.
func normCaps(caps []string) []string {
	norm := make([]string, 0, len(caps))
	for _, c := range caps {
		norm = append(norm, sandbox.CapabilityName(c))
	}
	sort.Strings(norm)
	return slices.Compact(norm)
}

func readLocalhost(rel, dir string) ([]byte, error) {
	if dir == "" {
		return nil, fieldErr("Localhost/%s: this node has no seccomp profile directory configured: use RuntimeDefault, or configure the directory and put the profile in it", rel)
	}
	if rel == "" || !filepath.IsLocal(rel) {
		return nil, fieldErr("localhostProfile %q must be a relative path inside %s without \"..\" (for example profiles/audit.json)", rel, dir)
	}
	// OpenInRoot also refuses a symlink that leads out of dir.
	f, err := os.OpenInRoot(dir, rel)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fieldErr("Localhost profile %s does not exist: put the JSON profile there or fix localhostProfile", filepath.Join(dir, rel))
		}
		return nil, fieldErr("Localhost profile %q: %v: the profile must be a regular file inside %s", rel, err, dir)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fieldErr("Localhost profile %q: %v", rel, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fieldErr("Localhost profile %s is not a regular file: point localhostProfile at a JSON file", filepath.Join(dir, rel))
	}
	body, err := io.ReadAll(io.LimitReader(f, maxProfileBytes+1))
	if err != nil {
		return nil, fieldErr("Localhost profile %q: %v", rel, err)
	}
	if len(body) > maxProfileBytes {
		return nil, fieldErr("Localhost profile %s is larger than %d bytes: a seccomp profile is a few KB", filepath.Join(dir, rel), maxProfileBytes)
	}
	return body, nil
}
