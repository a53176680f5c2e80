package sandbox

import (
	"os"
	"path"
	"slices"
	"sort"
)

// ImagePolicy is the Landlock policy of a container whose "/" is its image
// root (after pivot_root): the whole root may be read and executed, and
// written unless readOnlyRoot (then, as upstream, /tmp stays read-only
// too). /dev (null, zero, tty, pts, shm: the container's own) and /proc
// (oom_score_adj, comm, attr: Landlock cannot name /proc/self, and procfs
// writes are guarded by the pid and user namespaces) are always writable,
// and so is each writable volume target. The policy denies what is not
// beneath the container's root: a descriptor to a host directory that
// leaked past the pivot reaches nothing.
func ImagePolicy(writable []string, readOnlyRoot bool) *Landlock {
	l := &Landlock{ReadExec: []string{"/"}}
	if !readOnlyRoot {
		l.ReadWrite = append(l.ReadWrite, "/")
	}
	l.ReadWrite = append(l.ReadWrite, "/dev", "/proc")
	l.ReadWrite = append(l.ReadWrite, writable...)
	return clean(l)
}

// NativeSystemDirs are the host directories an `image: native` container
// may read and execute: programs, libraries, /opt, /sys and the resolver's
// files. /var (the host's state, k3sm's data, docker's), /run (sockets),
// /tmp, /home, /root, /srv and /mnt are not listed, so they are denied;
// /etc is listed entry by entry (nativeEtc).
var NativeSystemDirs = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
	"/nix/store",           // NixOS: every program and library
	"/run/systemd/resolve", // /etc/resolv.conf often links here
}

// nativeDevRead and nativeDevWrite are the host's /dev nodes a native
// container uses; the rest (disks, /dev/mem, …) is denied.
var (
	nativeDevRead  = []string{"/dev/random", "/dev/urandom"}
	nativeDevWrite = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/shm"}
)

// etcDenied are /etc entries a native container may not read: k3sm's own
// configuration (registry credentials, TLS keys) and the host's
// credentials.
var etcDenied = []string{"k3sm", "shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d"}

// etcFallback is what a native container may read of /etc when /etc cannot
// be listed: enough to resolve names, users and certificates.
var etcFallback = []string{"passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "os-release", "ssl", "ca-certificates",
	"pki", "alternatives", "mime.types", "services", "protocols"}

// NativePolicy is the Landlock policy of an `image: native` container (the
// host's view): read and execute NativeSystemDirs, /etc without k3sm's
// configuration and the credential files, podDir unless it is "" (the
// runtime passes "": the pod's <data>/pods/<uid> stays closed) and the
// read-only volumes; read and write the writable volumes (and the
// container's private directory: pass it in writable), /proc and /dev's
// null, zero, full, tty, ptmx, pts and shm. Paths are as the container
// sees them (a volume's mountPath). Everything else is denied: /home,
// /root, /run, /var, /tmp, the data dir (other pods, logs, sockets) and
// the rest of /dev.
func NativePolicy(podDir string, writable, readOnly []string) *Landlock {
	return nativePolicy(nativeEtc(), podDir, writable, readOnly)
}

func nativePolicy(etc []string, podDir string, writable, readOnly []string) *Landlock {
	l := &Landlock{}
	l.ReadExec = append(l.ReadExec, NativeSystemDirs...)
	l.ReadExec = append(l.ReadExec, etc...)
	l.ReadExec = append(l.ReadExec, nativeDevRead...)
	if podDir != "" {
		l.ReadExec = append(l.ReadExec, podDir)
	}
	l.ReadExec = append(l.ReadExec, readOnly...)
	l.ReadWrite = append(l.ReadWrite, "/proc")
	l.ReadWrite = append(l.ReadWrite, nativeDevWrite...)
	l.ReadWrite = append(l.ReadWrite, writable...)
	return clean(l)
}

// nativeEtc lists /etc's entries but etcDenied (entries added to /etc
// later are not readable), or etcFallback when /etc cannot be listed.
func nativeEtc() []string {
	names := etcFallback
	if ents, err := os.ReadDir("/etc"); err == nil {
		names = nil
		for _, e := range ents {
			names = append(names, e.Name())
		}
	}
	var out []string
	for _, n := range names {
		if !slices.Contains(etcDenied, n) {
			out = append(out, "/etc/"+n)
		}
	}
	sort.Strings(out)
	return out
}

// clean makes every path clean and drops exact duplicates (a path beneath
// another is kept: through a bind mount or a symlink it may be reached by a
// way the other rule does not cover).
func clean(l *Landlock) *Landlock {
	dedup := func(ps []string) []string {
		var out []string
		for _, p := range ps {
			if p == "" {
				continue
			}
			p = path.Clean(p)
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
		return out
	}
	l.ReadExec, l.ReadWrite = dedup(l.ReadExec), dedup(l.ReadWrite)
	return l
}
