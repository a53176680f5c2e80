// Package seatbelt renders the darwin boundary of a container: a
// default-deny Seatbelt (SBPL) profile that the shim runs the workload
// under with sandbox-exec (sandbox.WrapArgv). It is plain text generation,
// so it builds and is tested everywhere; only macOS enforces it.
//
// What a profile grants, in order (SBPL applies the last rule that
// matches, so later rules carve exceptions out of earlier ones):
//
//  1. processes: fork; exec only of what may be read below; signals and
//     process information only within the same sandbox;
//  2. the system, read and execute: /System, /usr/lib, /usr/libexec,
//     /usr/bin, /usr/sbin, /bin, /sbin, /Library/Apple; read only:
//     /usr/share, /private/etc, the time zone database; a few devices;
//     sysctls and Mach services a plain process needs;
//  3. explicit denies of the host's private areas: /Users, /Volumes,
//     /System/Volumes (the data volume is reachable there too; the dyld
//     cryptex under it is allowed again), root's home and /private/etc/k3sm;
//  4. explicit denies of k3sm's data dir: other pods, logs, sockets,
//     credentials;
//  5. the container's own paths: its root (read and execute; written
//     unless readOnlyRootFilesystem), its volumes (read-only ones read,
//     writable ones also written), single files (resolv.conf) and
//     libraries (the DNS interposer), unix sockets inside them; stat of
//     the directories leading to them;
//  6. the network, all or nothing, when the pod opts in (NetworkAnnotation);
//  7. no privilege escalation: sudo/su/login never; with
//     allowPrivilegeEscalation: false no setuid or setgid program at all.
package seatbelt

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/k3sm-dev/k3sm/internal/datadir"
)

// NetworkAnnotation opts a pod in to the network: "allow" gives every
// container IP networking (all of it: Seatbelt filters no addresses),
// "deny" or no annotation gives none.
const NetworkAnnotation = "k3sm.dev/network"

// Pod is what one container's profile is made from. Paths are absolute,
// clean and canonical (symlinks resolved: Seatbelt matches the path the
// kernel resolved, /private/tmp and not /tmp).
type Pod struct {
	// DataDir is k3sm's data directory (holding pods/, run/, logs/):
	// denied, except the container's own paths inside it.
	DataDir string
	// PodDir is the pod's directory, <DataDir>/pods/<uid>.
	PodDir string
	// Root is the container's root directory (inside PodDir).
	Root string
	// ReadOnlyRoot: readOnlyRootFilesystem, the root is not written.
	ReadOnlyRoot bool
	// Writable and ReadOnly are the host paths of the container's volumes.
	Writable []string
	ReadOnly []string
	// ReadFiles are single files the container reads (the pod's
	// resolv.conf).
	ReadFiles []string
	// Libraries are single libraries the container's processes load
	// (the DNS interposer of DYLD_INSERT_LIBRARIES): read and mapped
	// executable.
	Libraries []string
	// Network: IP networking allowed (NetworkAnnotation "allow").
	Network bool
	// NoPrivilegeEscalation: allowPrivilegeEscalation: false, no setuid
	// or setgid program may be executed.
	NoPrivilegeEscalation bool
}

// NetworkFromAnnotations reads NetworkAnnotation: true for "allow", false
// for "deny" or none.
func NetworkFromAnnotations(annotations map[string]string) (bool, error) {
	v, ok := annotations[NetworkAnnotation]
	if !ok {
		return false, nil
	}
	switch v {
	case "allow":
		return true, nil
	case "deny":
		return false, nil
	}
	return false, fmt.Errorf("annotation %s: %q is neither \"allow\" nor \"deny\": set it to \"allow\" to give the pod the network, or remove it", NetworkAnnotation, v)
}

// System directories every container reads and executes from. /System
// holds the frameworks and, before macOS 13, the dyld shared cache; the
// cryptexes hold the shared cache since macOS 13 (/System/Cryptexes is a
// link into the Preboot volume, whose mount points are listed too).
var systemExec = []string{
	"/System",
	"/usr/lib",
	"/usr/libexec",
	"/usr/bin",
	"/usr/sbin",
	"/bin",
	"/sbin",
	"/Library/Apple", // Rosetta and Apple's own libraries
}

var cryptexes = []string{
	"/System/Cryptexes",
	"/System/Volumes/Preboot/Cryptexes",
	"/private/preboot/Cryptexes",
}

// System directories read but never executed from.
var systemRead = []string{
	"/usr/share",
	"/private/etc",
	"/private/var/db/timezone", // /etc/localtime points here
}

// hostDenied are the host's private areas, denied even where an earlier
// rule would reach them (/System/Volumes/Data is a second path to every
// file of the data volume).
var hostDenied = []string{
	"/Users",
	"/Volumes",
	"/System/Volumes",
	"/private/var/root",
	"/private/etc/k3sm",
}

// escalation are the programs that exist to change user; never executed.
var escalation = []string{
	"/usr/bin/sudo",
	"/usr/bin/su",
	"/usr/bin/login",
	"/usr/libexec/security_authtrampoline",
}

// sysctls a process reads at start (the Go runtime: hw.ncpu, hw.pagesize,
// hw.optional.*, kern.osrelease; libc: kern.argmax, kern.usrstack64, …).
// kern.proc.* and kern.procargs* are left out: with them a pod lists
// every process of k3sm's user, and reads their arguments.
var sysctlNames = []string{
	"hw.activecpu", "hw.byteorder", "hw.cachelinesize", "hw.cpufamily", "hw.cpusubtype",
	"hw.cputype", "hw.l1dcachesize", "hw.l1icachesize", "hw.l2cachesize", "hw.logicalcpu",
	"hw.logicalcpu_max", "hw.machine", "hw.memsize", "hw.model", "hw.ncpu", "hw.nperflevels",
	"hw.packages", "hw.pagesize", "hw.physicalcpu", "hw.physicalcpu_max", "hw.tbfrequency",
	"kern.argmax", "kern.hostname", "kern.maxfiles", "kern.maxfilesperproc", "kern.maxproc",
	"kern.ngroups", "kern.osproductversion", "kern.osrelease", "kern.ostype", "kern.osvariant_status",
	"kern.osversion", "kern.secure_kernel", "kern.usrstack64", "kern.version",
	"machdep.cpu.brand_string", "sysctl.proc_cputype", "sysctl.proc_translated", "vm.loadavg",
}

var sysctlPrefixes = []string{"hw.optional.", "hw.perflevel"}

// Mach services of a plain process: logging, notifications, and user and
// group lookups (getpwuid, `id`).
var machServices = []string{
	"com.apple.logd",
	"com.apple.system.logger",
	"com.apple.system.notification_center",
	"com.apple.system.opendirectoryd.libinfo",
	"com.apple.system.opendirectoryd.membership",
}

// Mach services a networked process also needs: the resolver's
// configuration and certificate trust (Security.framework).
var networkMachServices = []string{
	"com.apple.SystemConfiguration.DNSConfiguration",
	"com.apple.SystemConfiguration.configd",
	"com.apple.SecurityServer",
	"com.apple.ocspd",
	"com.apple.trustd",
	"com.apple.trustd.agent",
}

// denyOps are what the explicit denies refuse: existence tests, exec and
// mapping too, since those are checked apart from reading (and so the
// read rules name file-test-existence beside file-read*).
const denyOps = "file-read* file-test-existence file-write* file-map-executable process-exec"

const mDNSResponderSocket = "/private/var/run/mDNSResponder"

// Profile renders the SBPL profile of one container. It refuses paths it
// cannot express and volumes that would open k3sm's own state to the pod.
func Profile(p Pod) (string, error) {
	if err := p.check(); err != nil {
		return "", err
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	w("(version 1)")
	w("; The boundary of one k3sm container, generated by internal/runtime/sandbox/seatbelt.")
	w("; SBPL applies the last rule that matches: later rules carve exceptions out of earlier ones.")
	w("(deny default)")
	w("")
	w("; Processes: fork; exec of what may be read (below); signals and process")
	w("; information only within this sandbox.")
	w("(allow process-fork)")
	w("(allow signal (target same-sandbox))")
	w("(allow process-info* (target same-sandbox))")
	w("")
	w("; The system: read and execute.")
	rule(&b, "allow file-read* file-test-existence file-map-executable", subpaths(systemExec))
	rule(&b, "allow process-exec", subpaths(systemExec))
	rule(&b, "allow file-read* file-test-existence", subpaths(systemRead))
	w("(allow file-read* file-test-existence (literal \"/\"))")
	w("(allow file-read-metadata file-test-existence (literal \"/etc\") (literal \"/tmp\") (literal \"/var\") (literal \"/dev\"))")
	w("; /bin/sh runs the shell this link names.")
	w("(allow file-read* file-test-existence (literal \"/private/var/select/sh\"))")
	w("(allow file-read* file-test-existence file-write-data (literal \"/dev/null\") (literal \"/dev/zero\"))")
	w("(allow file-read* file-test-existence (literal \"/dev/random\") (literal \"/dev/urandom\"))")
	w("(allow file-read-data file-write-data (subpath \"/dev/fd\"))")
	w("; /dev/tty is the process's own controlling terminal, never another's.")
	w("(allow file-read* file-test-existence file-write-data file-ioctl (literal \"/dev/tty\"))")
	w("(allow sysctl-read")
	for _, n := range sysctlNames {
		w("  (sysctl-name %s)", quote(n))
	}
	for _, n := range sysctlPrefixes {
		w("  (sysctl-name-prefix %s)", quote(n))
	}
	w(")")
	w("(allow mach-lookup")
	for _, n := range machServices {
		w("  (global-name %s)", quote(n))
	}
	w(")")
	w("(allow ipc-posix-shm-read-data (ipc-posix-name \"apple.shm.notification_center\"))")
	w("")
	w("; The host's private areas.")
	rule(&b, "deny "+denyOps, subpaths(hostDenied))
	w("; The dyld shared cache lives in the Preboot volume (macOS 13 and later).")
	rule(&b, "allow file-read* file-test-existence file-map-executable", subpaths(cryptexes))
	w("")
	l := datadir.New(p.DataDir)
	w("; k3sm's data dir: other pods, logs, sockets and credentials.")
	rule(&b, "deny "+denyOps, subpaths([]string{p.DataDir, l.PodsDir(), l.LogDir(), l.RunDir()}))
	w("(deny network-outbound (remote unix-socket (subpath %s)))", quote(p.DataDir))
	w("")

	w("; The container's own paths.")
	execs := append([]string{p.Root}, p.ReadOnly...)
	execs = append(execs, p.Writable...)
	rule(&b, "allow file-read* file-test-existence file-map-executable", subpaths(execs))
	rule(&b, "allow process-exec", subpaths(execs))
	writable := p.Writable
	if !p.ReadOnlyRoot {
		writable = append([]string{p.Root}, p.Writable...)
	}
	rule(&b, "allow file-write*", subpaths(writable))
	rule(&b, "allow file-read* file-test-existence", literals(p.ReadFiles))
	rule(&b, "allow file-read* file-test-existence file-map-executable", literals(p.Libraries))
	w("; Unix sockets: bound and accepted in the writable paths, connected to in")
	w("; every own path (one path per rule: the filter takes one).")
	w("(allow system-socket (socket-domain AF_UNIX))")
	for _, d := range writable {
		w("(allow network-bind network-inbound (local unix-socket (subpath %s)))", quote(d))
	}
	for _, d := range execs {
		w("(allow network-outbound (remote unix-socket (subpath %s)))", quote(d))
	}
	w("; stat of the directories leading to them (getcwd, realpath).")
	rule(&b, "allow file-read-metadata file-test-existence", literals(ancestors(slices.Concat(execs, p.ReadFiles, p.Libraries))))
	w("")

	if p.Network {
		w("; Network: the pod opted in (%s: allow); Seatbelt cannot filter addresses.", NetworkAnnotation)
		w("(allow system-socket)")
		w("(allow network-bind (local ip))")
		w("(allow network-inbound (local ip))")
		w("(allow network-outbound (remote ip))")
		w("(allow network-outbound (remote unix-socket (path-literal %s)))", quote(mDNSResponderSocket))
		w("(allow sysctl-read (sysctl-name-prefix \"net.routetable.\"))")
		w("(allow mach-lookup")
		for _, n := range networkMachServices {
			w("  (global-name %s)", quote(n))
		}
		w(")")
	} else {
		w("; Network: none (annotate the pod %s: allow to opt in).", NetworkAnnotation)
	}
	w("")
	w("; No change of user.")
	rule(&b, "deny process-exec", literals(escalation))
	if p.NoPrivilegeEscalation {
		w("; allowPrivilegeEscalation: false: no setuid or setgid program.")
		w("(deny process-exec (require-any (file-mode #o4000) (file-mode #o2000)))")
	}
	return b.String(), nil
}

// check validates p's paths: each expressible, and none opening k3sm's own
// state to the pod.
func (p Pod) check() error {
	for _, f := range []struct{ name, path string }{{"DataDir", p.DataDir}, {"PodDir", p.PodDir}, {"Root", p.Root}} {
		if f.path == "" {
			return fmt.Errorf("seatbelt: Pod.%s is required", f.name)
		}
		if err := checkPath(f.path); err != nil {
			return fmt.Errorf("seatbelt: Pod.%s: %w", f.name, err)
		}
	}
	if p.DataDir == "/" {
		return fmt.Errorf("seatbelt: Pod.DataDir is /: k3sm's data dir must be a directory of its own")
	}
	l := datadir.New(p.DataDir)
	uid := filepath.Base(p.PodDir)
	if p.PodDir != l.PodDir(uid) {
		return fmt.Errorf("seatbelt: Pod.PodDir %s is not a pod directory %s", p.PodDir, l.PodDir("<uid>"))
	}
	roots := filepath.Dir(l.PodRootDir(uid, "x"))
	if !beneath(p.Root, roots) {
		return fmt.Errorf("seatbelt: Pod.Root %s is not a container root under %s", p.Root, roots)
	}
	volumes := filepath.Dir(l.PodVolumeDir(uid, "x"))
	for _, list := range []struct {
		name  string
		paths []string
	}{{"volume", p.Writable}, {"volume", p.ReadOnly}, {"file", p.ReadFiles}, {"library", p.Libraries}} {
		for _, v := range list.paths {
			if err := checkPath(v); err != nil {
				return fmt.Errorf("seatbelt: %s %w", list.name, err)
			}
			switch {
			case within(p.DataDir, v):
				return fmt.Errorf("seatbelt: %s %s contains k3sm's data dir %s: a pod may not reach k3sm's own state; mount a narrower path", list.name, v, p.DataDir)
			case !within(v, p.DataDir):
			case list.name == "file" && v == l.PodResolvConf(uid):
			case list.name == "volume" && (beneath(v, volumes) || beneath(v, l.StorageDir())):
			default:
				return fmt.Errorf("seatbelt: %s %s is inside k3sm's data dir %s: only the pod's own volumes (under %s), its resolv.conf and local PersistentVolumes (under %s) may be used from there", list.name, v, p.DataDir, volumes, l.StorageDir())
			}
		}
	}
	return nil
}

// checkPath refuses what an SBPL path filter cannot match as given.
func checkPath(p string) error {
	switch {
	case !utf8.ValidString(p):
		return fmt.Errorf("%q is not valid UTF-8", p)
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%q contains a control character, which a profile cannot express", p)
	case !filepath.IsAbs(p):
		return fmt.Errorf("%q is not absolute", p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("%q is not clean (want %q)", p, filepath.Clean(p))
	}
	return nil
}

// within reports whether p is dir or beneath it; beneath, strictly below.
func within(p, dir string) bool { return p == dir || beneath(p, dir) }

func beneath(p, dir string) bool {
	return p != dir && (dir == "/" || strings.HasPrefix(p, dir+"/"))
}

// quote renders s as an SBPL (TinyScheme) string literal.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func subpaths(ps []string) []string { return filters("subpath", ps) }
func literals(ps []string) []string { return filters("literal", ps) }

func filters(kind string, ps []string) []string {
	out := make([]string, 0, len(ps))
	seen := map[string]bool{}
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, "("+kind+" "+quote(p)+")")
		}
	}
	return out
}

// rule writes (op filter…), one filter a line; nothing without filters (a
// rule without one would match everything).
func rule(b *strings.Builder, op string, fs []string) {
	if len(fs) == 0 {
		return
	}
	b.WriteString("(" + op)
	for _, f := range fs {
		b.WriteString("\n  " + f)
	}
	b.WriteString(")\n")
}

// ancestors lists every directory above the paths, "/" excepted (allowed
// already), each once, parents first.
func ancestors(ps []string) []string {
	var out []string
	seen := map[string]bool{"/": true}
	for _, p := range ps {
		var chain []string
		for d := filepath.Dir(p); !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			chain = append(chain, d)
		}
		for i := len(chain) - 1; i >= 0; i-- {
			out = append(out, chain[i])
		}
	}
	return out
}
