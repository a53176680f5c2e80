// Package sandbox owns the boundary around a container's processes on Linux:
// what a container's main process, its execs, exec probes and exec hooks all
// enter before they run, so that nothing reaches a pod by another way. The
// daemon describes the boundary in a Spec (carried in the shim's config);
// the shim prepares the pod's root in its own mount namespace and starts the
// container through a re-exec of itself (Init) that enters the pod's user,
// pid, UTS and IPC namespaces, pivots into the root and drops to the pod's
// identity, capabilities, Landlock domain and seccomp filter before it
// executes the workload. Exec enters the same namespaces (EnterArgv) and
// applies the same restrictions.
//
// It links only the standard library, x/sys (Landlock is its raw
// syscalls, landlock_linux.go) and the runtime's small mounts and
// procgroup packages, because the shim imports it.
package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// IDMap maps Size ids from ContainerID (inside the pod's user namespace) to
// HostID.
type IDMap struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

// Spec is the boundary of one container.
type Spec struct {
	// Lower is the image's unpacked root filesystem, shared read-only by
	// every container of the image; Upper and Work are this container's
	// own overlay directories. With Lower the container's "/" is that
	// overlay; without it the container keeps the host's view
	// (`image: native`).
	Lower string `json:"lower,omitempty"`
	Upper string `json:"upper,omitempty"`
	Work  string `json:"work,omitempty"`
	// ReadOnlyRoot makes "/" read-only (readOnlyRootFilesystem); volumes
	// stay as they are.
	ReadOnlyRoot bool `json:"readOnlyRoot,omitempty"`

	// UIDMap and GIDMap are the pod's user namespace (empty: none).
	UIDMap []IDMap `json:"uidMap,omitempty"`
	GIDMap []IDMap `json:"gidMap,omitempty"`
	// UID, GID and Groups are the process's identity inside it.
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// Hostname is set in the pod's UTS namespace.
	Hostname string `json:"hostname,omitempty"`

	// Capabilities are kept in the bounding set (names as "CAP_CHOWN");
	// every other capability is dropped.
	Capabilities []string `json:"capabilities,omitempty"`
	// NoNewPrivileges sets no_new_privs (allowPrivilegeEscalation: false).
	NoNewPrivileges bool `json:"noNewPrivileges,omitempty"`
	// Seccomp is the filter loaded last before the workload runs (nil:
	// unconfined).
	Seccomp []SockFilter `json:"seccomp,omitempty"`
	// Landlock restricts the filesystem (nil: not restricted).
	Landlock *Landlock `json:"landlock,omitempty"`

	// Seatbelt is the rendered SBPL profile the darwin shim runs the
	// workload under (WrapArgv); unused on Linux.
	Seatbelt string `json:"seatbelt,omitempty"`

	// Own are volumes the rootless init gives to the pod's fsGroup before
	// it builds the root (a runtime that is not root cannot give files to
	// its subordinate ids; as root the runtime does it itself).
	Own []Own `json:"own,omitempty"`

	// Join is the running workload of the container an ephemeral
	// container targets (kubectl debug --target): the init joins its
	// user, pid, UTS and IPC namespaces instead of making its own, so the
	// debugger sees the target's processes and reaches the target's files
	// through /proc/<pid>/root from a root of its own. Nil: new ones.
	Join *Join `json:"join,omitempty"`
}

// Join names a running process by its pid and its start time in clock
// ticks after boot (/proc/<pid>/stat): a pid the kernel has since given to
// another process is not joined.
type Join struct {
	Pid        int    `json:"pid"`
	StartTicks uint64 `json:"startTicks"`
}

// Own gives the volume directory Path (a host path) to group GID of the
// pod's user namespace: with Setgid (an emptyDir) the directory becomes
// 0777 and setgid so new files join the group; otherwise (files volumes)
// every entry below it gets the group.
type Own struct {
	Path   string `json:"path"`
	GID    uint32 `json:"gid"`
	Setgid bool   `json:"setgid,omitempty"`
}

// Landlock lists the paths (as the container sees them) a container may
// use; everything else the kernel's Landlock ABI handles is denied.
type Landlock struct {
	// ReadExec may be read and executed (directories: beneath them).
	ReadExec []string `json:"readExec,omitempty"`
	// ReadWrite may also be written, created in and removed from.
	ReadWrite []string `json:"readWrite,omitempty"`
}

// SockFilter is one classic BPF instruction of a seccomp filter (the
// layout of struct sock_filter).
type SockFilter struct {
	Code uint16 `json:"c"`
	Jt   uint8  `json:"t,omitempty"`
	Jf   uint8  `json:"f,omitempty"`
	K    uint32 `json:"k,omitempty"`
}

// JoinCgroups places process pid (0: the caller) in each cgroup directory:
// the container's main process before it runs, and each exec.
func JoinCgroups(dirs []string, pid int) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("place the process in the container's cgroup %s: %w", d, err)
		}
	}
	return nil
}

// Attempt is what a container attempt's shim files say of its boundary:
// config.json (shim.Config: sandbox, cgroups) and shim.json (the
// workload's pid and start time). This package cannot import the shim's,
// which imports it; the field names are the shim's.
type Attempt struct {
	Sandbox    *Spec    `json:"sandbox"`
	Cgroups    []string `json:"cgroups"`
	Pid        int      `json:"pid"`
	StartTicks uint64   `json:"startTicks"`
}

// ReadAttempt reads the attempt in dir: its config, and with running its
// pid and start time too (an error when the shim has not recorded them).
func ReadAttempt(dir string, running bool) (Attempt, error) {
	var a Attempt
	files := []string{"config.json"}
	if running {
		files = append(files, "shim.json")
	}
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil {
			return Attempt{}, err
		}
	}
	return a, nil
}

// DefaultCapabilities are what a container's root keeps unless it drops
// them: containerd's and Docker's default set. The seccomp profile is
// built for them, and the pod's capabilities start from them.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// CapabilityName spells a capability as the kernel's headers and the
// profiles do: "net_admin" and "NET_ADMIN" are "CAP_NET_ADMIN" ("ALL"
// stays "ALL").
func CapabilityName(s string) string {
	s = strings.ToUpper(strings.TrimSpace(s))
	if s != "ALL" && !strings.HasPrefix(s, "CAP_") {
		s = "CAP_" + s
	}
	return s
}
