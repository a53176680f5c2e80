package doctor

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/limits"
	"github.com/k3sm-dev/k3sm/internal/server/certs"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/syserr"
	"github.com/k3sm-dev/k3sm/internal/units"
)

// privilege: root decides the pod network mode (--pod-network auto).
func privilege(euid int) Check {
	if euid == 0 {
		return Check{Name: "privilege", Status: Pass, Detail: "running as root: --pod-network auto gives each pod its own network namespace and IP (k3sm-netd), with the Service proxy and cluster DNS"}
	}
	return Check{Name: "privilege", Status: Warn,
		Detail: fmt.Sprintf("running as uid %d: --pod-network auto falls back to host (pods share the node's network, no Service ClusterIPs or cluster DNS) unless --netd-socket names a k3sm-netd run as root", euid),
		Fix:    "for a pod network run `sudo k3sm install` or `sudo k3sm server`, or run k3sm-netd as root for your uid and pass --netd-socket (docs/networking.md)"}
}

func portVerdict(p Port, err error) Check {
	addr := net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
	c := Check{Name: "port " + strconv.Itoa(p.Port)}
	if err == nil {
		c.Status, c.Detail = Pass, addr+" is free (--"+p.Flag+")"
		return c
	}
	c.Status, c.Detail = Fail, fmt.Sprintf("cannot listen on %s (--%s): %v", addr, p.Flag, syserr.Cause(err))
	c.Fix = "stop what listens there (e.g. `ss -ltnp 'sport = :" + strconv.Itoa(p.Port) + "'`) or start k3sm with another --" + p.Flag
	return c
}

// DiskUsage is a filesystem's size and what is free, for the unprivileged.
type DiskUsage struct {
	Total, Avail, Inodes, InodesFree uint64
}

// diskVerdict: FAIL when the data dir cannot be written or has less than
// MinFreeBytes; WARN below the node's eviction thresholds (the node then
// reports DiskPressure and evicts pods).
func diskVerdict(dir, probed string, werr error, u DiskUsage, th []diskpolicy.Threshold) Check {
	c := Check{Name: "data-dir"}
	where := dir
	if probed != dir {
		where = dir + " (does not exist yet; checked " + probed + ")"
	}
	if werr != nil {
		werr = syserr.Cause(werr)
		c.Status, c.Detail = Fail, where+" is not writable: "+werr.Error()
		switch {
		case errors.Is(werr, syscall.EROFS):
			c.Fix = "the filesystem is read-only: remount it read-write or pass --data-dir on a writable one"
		case errors.Is(werr, syscall.ENOSPC):
			c.Fix = "the filesystem is full: free space or pass --data-dir on another filesystem"
		default:
			c.Fix = "run as the data dir's owner (sudo for /var/lib/k3sm) or pass --data-dir under your home"
		}
		return c
	}
	free := fmt.Sprintf("%s free of %s", units.Bytes(int64(u.Avail)), units.Bytes(int64(u.Total)))
	if u.Avail < MinFreeBytes {
		c.Status, c.Detail = Fail, fmt.Sprintf("%s: only %s (k3sm needs at least %s for the datastore and images)", where, free, units.Bytes(MinFreeBytes))
		c.Fix = "free space on that filesystem or pass --data-dir on a larger one"
		return c
	}
	for _, t := range th {
		var have, total uint64
		switch t.Signal {
		case "nodefs.available", "imagefs.available":
			have, total = u.Avail, u.Total
		case "nodefs.inodesFree", "imagefs.inodesFree":
			have, total = u.InodesFree, u.Inodes
		}
		if total == 0 {
			continue // e.g. a filesystem without an inode count
		}
		low := false
		if t.Percent > 0 {
			low = float64(have)*100/float64(total) < t.Percent
		} else {
			low = have < uint64(t.Value)
		}
		if low {
			c.Status = Warn
			c.Detail = fmt.Sprintf("%s: %s, below the eviction threshold %s (%s): the node reports DiskPressure and evicts pods", where, free, t.Signal, thresholdString(t))
			c.Fix = "free space (`k3sm image prune`, old snapshots), or set --eviction-hard for a small disk"
			return c
		}
	}
	c.Status, c.Detail = Pass, where+" is writable, "+free
	return c
}

func thresholdString(t diskpolicy.Threshold) string {
	if t.Percent > 0 {
		return "<" + strconv.FormatFloat(t.Percent, 'f', -1, 64) + "%"
	}
	return "<" + strconv.FormatInt(t.Value, 10)
}

// clockVerdict: certificates and tokens are checked against the clock, so a
// clock years off (a dead RTC battery boots in 1970 or 2000) breaks TLS.
func clockVerdict(now time.Time, synced, known bool) Check {
	c := Check{Name: "clock"}
	if y := now.Year(); y < 2025 || y > 2100 {
		c.Status, c.Detail = Fail, "the clock says "+now.UTC().Format(time.RFC3339)+": certificates would be not yet valid or expired"
		c.Fix = "set the time (`timedatectl set-ntp true`, or `date -s`)"
		return c
	}
	switch {
	case !known:
		c.Status, c.Detail = Pass, now.UTC().Format(time.RFC3339)+" (whether it is NTP-synchronized cannot be read here)"
	case synced:
		c.Status, c.Detail = Pass, now.UTC().Format(time.RFC3339)+", synchronized (kernel NTP status)"
	default:
		c.Status, c.Detail = Warn, now.UTC().Format(time.RFC3339)+", not synchronized: the kernel reports no NTP sync; a drifting clock makes certificates and tokens look not yet valid or expired to other machines"
		c.Fix = "enable time sync: `timedatectl set-ntp true` (systemd-timesyncd) or chrony"
	}
	return c
}

func certVerdict(list []certs.Cert, err error, now time.Time) Check {
	c := Check{Name: "certificates"}
	if err != nil {
		c.Status, c.Detail, c.Fix = Fail, err.Error(), "restore the data dir's server/tls from a snapshot (`k3sm snapshot restore`)"
		return c
	}
	var expired, renew, rotateCA []string
	var soonest *certs.Cert
	for i, x := range list {
		switch x.Status {
		case "expired":
			expired = append(expired, x.Name)
		case "renew":
			renew = append(renew, x.Name)
		case "rotate-ca":
			rotateCA = append(rotateCA, x.Name)
		}
		if soonest == nil || x.NotAfter.Before(soonest.NotAfter) {
			soonest = &list[i]
		}
	}
	switch {
	case len(expired) > 0:
		c.Status, c.Detail = Fail, "expired: "+strings.Join(expired, ", ")
		c.Fix = "stop the server and run `k3sm certificate rotate` (a CA: docs/operations.md, \"Rotating the CAs\")"
	case len(rotateCA) > 0:
		c.Status, c.Detail = Warn, "CAs expire within a year: "+strings.Join(rotateCA, ", ")
		c.Fix = "rotate them: docs/operations.md, \"Rotating the CAs\""
	case len(renew) > 0:
		c.Status, c.Detail = Warn, "leaves within 90 days of expiry: "+strings.Join(renew, ", ")
		c.Fix = "restart the server (it renews them at start) or stop it and run `k3sm certificate rotate`"
	case soonest == nil:
		c.Status, c.Detail = Pass, "no certificates found"
	default:
		c.Status = Pass
		c.Detail = fmt.Sprintf("%d certificates valid; the first to expire is %s on %s (%d days)", len(list), soonest.Name,
			soonest.NotAfter.UTC().Format("2006-01-02"), int(soonest.NotAfter.Sub(now).Hours()/24))
	}
	return c
}

// usernsVerdict: the runtime daemon puts each container in a mount
// namespace; unprivileged it needs a user namespace for that.
func usernsVerdict(maxUserNS int, unprivClone, apparmorRestrict string, euid int) Check {
	c := Check{Name: "user-namespaces"}
	var problem, fix string
	switch {
	case maxUserNS == 0:
		problem, fix = "user.max_user_namespaces is 0", "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/)"
	case unprivClone == "0":
		problem, fix = "kernel.unprivileged_userns_clone is 0", "sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/)"
	case apparmorRestrict == "1":
		problem, fix = "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)", "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or run k3sm as root"
	}
	if problem == "" {
		c.Status, c.Detail = Pass, fmt.Sprintf("available to unprivileged users (max_user_namespaces %d)", maxUserNS)
		return c
	}
	if euid == 0 {
		c.Status, c.Detail = Warn, problem+": fine as root (containers get a mount namespace without one), but an unprivileged k3sm cannot start containers"
	} else {
		c.Status, c.Detail = Fail, problem+": running unprivileged, the runtime cannot give containers their mount namespace"
	}
	c.Fix = fix
	return c
}

// podIDsVerdict: the ids a pod's user namespace gets. why is
// sandbox.RootlessIDs' for an unprivileged runtime ("" when it has a
// subordinate range).
func podIDsVerdict(euid int, why string) Check {
	c := Check{Name: "pod-ids"}
	switch {
	case euid == 0:
		c.Status, c.Detail = Pass, "running as root: each pod's user namespace maps a range of 65536 host ids of its own"
	case why == "":
		c.Status, c.Detail = Pass, fmt.Sprintf("running as uid %d: a pod's root is uid %d and its ids 1-65535 come from the subordinate range (newuidmap)", euid, euid)
	default:
		detail, fix, _ := strings.Cut(why, "; to fix: ")
		c.Status, c.Detail, c.Fix = Warn, detail+"; a pod asking for another user (runAsUser, runAsGroup, fsGroup, an image's User) is refused", fix
	}
	return c
}

func overlayVerdict(filesystems string) Check {
	c := Check{Name: "overlayfs"}
	for _, line := range strings.Split(filesystems, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
			c.Status, c.Detail = Pass, "overlay is in /proc/filesystems"
			return c
		}
	}
	c.Status, c.Detail = Warn, "overlay is not in /proc/filesystems: image layers cannot be stacked by the kernel"
	c.Fix = "modprobe overlay (and add it to /etc/modules-load.d/)"
	return c
}

// landlockVerdict: abi and err from sandbox.LandlockVersion, the ABI the
// runtime's sandbox restricts pods with (sandbox.ApplyLandlock uses the
// best the kernel has).
func landlockVerdict(abi int, err error) Check {
	c := Check{Name: "landlock"}
	const none = ": pods' file access is not restricted by Landlock; their mount and user namespaces are the only boundary"
	const fix = "use a kernel built with CONFIG_SECURITY_LANDLOCK=y (5.13 or later) and add landlock to the lsm= boot parameter (e.g. lsm=landlock,lockdown,yama,apparmor,bpf; the active list is in /sys/kernel/security/lsm)"
	switch {
	case errors.Is(err, syscall.ENOSYS):
		c.Status, c.Detail, c.Fix = Warn, "the kernel has no Landlock (ENOSYS)"+none, fix
	case errors.Is(err, syscall.EOPNOTSUPP):
		c.Status, c.Detail, c.Fix = Warn, "Landlock is built in but not enabled (EOPNOTSUPP)"+none, fix
	case err != nil:
		c.Status, c.Detail, c.Fix = Warn, "landlock_create_ruleset: "+err.Error()+none, fix
	case abi < 1:
		c.Status, c.Detail, c.Fix = Warn, fmt.Sprintf("Landlock ABI %d", abi)+none, fix
	case abi == 1:
		c.Status = Warn
		c.Detail = "Landlock ABI v1: pods' file access is restricted, but before ABI 2 no file can be renamed or linked into another directory inside a pod (EXDEV)"
		c.Fix = "upgrade to kernel 5.19 or later (Landlock ABI 2)"
	case abi < 3:
		c.Status, c.Detail = Pass, fmt.Sprintf("Landlock ABI v%d: pods' file access is restricted (truncate is confined from ABI 3, device ioctls from ABI 5)", abi)
	case abi < 5:
		c.Status, c.Detail = Pass, fmt.Sprintf("Landlock ABI v%d: pods' file access is restricted (device ioctls are confined from ABI 5)", abi)
	default:
		c.Status, c.Detail = Pass, fmt.Sprintf("Landlock ABI v%d: pods' file access is restricted", abi)
	}
	return c
}

// cgroupVerdict: which pod limits the kernel enforces, as the running
// runtime reports them (its socket) or, none running, as cgroups.Detect
// finds them here: never a reading of doctor's own while a runtime runs,
// which may see another /sys (`ip netns exec` remounts it). CPU or memory
// limits not enforced FAIL: the kubelet would not run at all, and a pod
// then takes CPU beyond its limit from its neighbours (a 100m pod was seen
// using 391m), for a cause on the host that has a fix. Where the cause is
// the runtime's privileges or its configuration (an unprivileged runtime
// without a delegated cgroup: the documented rootless fallback) it is a
// WARN, as privilege is.
func cgroupVerdict(r limits.Report, socket string, euid int) Check {
	c := Check{Name: "cgroups"}
	src := "the running runtime reports"
	switch {
	case r.AskErr != nil:
		src = fmt.Sprintf("the runtime at %s could not be asked (%v); doctor, as uid %d, finds", socket, r.AskErr, euid)
	case !r.FromRuntime:
		src = "no runtime runs at " + socket + "; one started now would find"
	}
	s := r.Support
	switch missing := limits.Unenforced(s); {
	case missing != "":
		c.Status = Fail
		if s.Cause == cgroups.CauseNotPermitted || s.Cause == cgroups.CauseDisabled {
			c.Status = Warn
		}
		c.Detail = fmt.Sprintf("%s %s: pods' %s are not enforced by the kernel (CPU time is only weighted by a nice priority, memory checked about once a second; such pods get a LimitNotEnforced event)", src, s.Describe(), missing)
		c.Fix = s.Fix
	case !s.Enforces(cgroups.Pids):
		c.Status = Warn
		c.Detail = fmt.Sprintf("%s %s: pods' pids limit (%d) is not enforced", src, s.Describe(), cgroups.DefaultPodPidsLimit)
		c.Fix = s.Fix
	case s.Version == cgroups.V1:
		c.Status = Warn
		c.Detail = src + " " + s.Describe() + "; but cgroup v1 delegates no subtree to a service (Delegate=yes hands k3sm nothing), and systemd and Kubernetes are dropping it"
		c.Fix = "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2) for delegation; k3sm works without it"
	default:
		c.Status, c.Detail = Pass, src+" "+s.Describe()
	}
	if c.Fix == "" && c.Status != Pass {
		c.Fix = "see the runtime's log (`resources:` at its start)"
	}
	if r.AskErr != nil {
		if c.Status == Pass {
			c.Status = Warn
		}
		c.Fix = strings.TrimPrefix(c.Fix+"; ", "; ") + "run doctor as the server's user (`sudo k3sm doctor`) so that it asks the runtime"
	}
	return c
}

// attachVerdict: whether joining a cgroup skips an RCU grace period
// (cgroup2 favordynmods), which every container start does.
func attachVerdict(mode cgroups.AttachMode, err error, euid int) Check {
	c := Check{Name: "cgroup-attach"}
	switch {
	case err != nil:
		c.Status, c.Detail, c.Fix = Warn, err.Error(), "check that /proc is mounted"
	case mode.Favored:
		c.Status, c.Detail = Pass, mode.Describe()
	case mode.Mount == "":
		c.Status, c.Detail = Warn, mode.Describe()+": each container start waits for an RCU grace period (~6–12 ms) to join its cgroups"
		c.Fix = "mount a cgroup2 hierarchy (current systemd does) so that k3sm can set favordynmods; pods start without it, a little slower"
	case euid == 0:
		c.Status, c.Detail = Warn, mode.Describe()+"; a k3sm server run as root sets it when its runtime starts (--cgroup-favordynmods, on by default)"
		c.Fix = "start the server (or `mount -o remount,favordynmods " + mode.Mount + "` with the options it has); on a kernel before 6.1 there is no such option"
	default:
		c.Status, c.Detail = Warn, mode.Describe()+"; a runtime that is not root cannot set it"
		c.Fix = "as root: `mount -o remount,favordynmods " + mode.Mount + "` with the options it has (kernel 6.1+)"
	}
	return c
}

// nftVerdict: netd programs the pods' network policy and guard with
// nftables over netlink.
func nftVerdict(tables []string, err error, euid int) Check {
	c := Check{Name: "nftables"}
	if err != nil {
		if euid != 0 {
			c.Status, c.Detail = Warn, "cannot read nftables as uid "+strconv.Itoa(euid)+" ("+err.Error()+"): only k3sm-netd (root) needs them"
			c.Fix = "run `sudo k3sm doctor` to check what netd needs"
			return c
		}
		c.Status, c.Detail = Fail, "nftables over netlink: "+err.Error()+": k3sm-netd cannot program the pod network's filters"
		c.Fix = "load nf_tables (modprobe nf_tables), or run with --pod-network host"
		return c
	}
	var ours []string
	for _, t := range tables {
		if strings.HasPrefix(t, "k3sm-") {
			ours = append(ours, t)
		}
	}
	if len(ours) == 0 {
		c.Status, c.Detail = Pass, fmt.Sprintf("nftables over netlink works (%d tables; k3sm-netd creates k3sm-policy and k3sm-guard when pods start, k3sm-services for ClusterIPs in the kernel)", len(tables))
	} else {
		c.Status, c.Detail = Pass, "nftables over netlink works; k3sm's tables: "+strings.Join(ours, ", ")
	}
	return c
}

// apfsVerdict (darwin): pod roots are cloned with clonefile(2) on APFS and
// copied file by file elsewhere.
func apfsVerdict(dir, fstype string, err error) Check {
	c := Check{Name: "apfs"}
	switch {
	case err != nil:
		c.Status, c.Detail, c.Fix = Warn, "cannot read the filesystem of "+dir+": "+err.Error(), "pass --data-dir on an APFS volume"
	case fstype == "apfs":
		c.Status, c.Detail = Pass, dir+" is on APFS: pod roots are cloned copy-on-write (clonefile)"
	default:
		c.Status, c.Detail = Warn, dir+" is on "+fstype+", not APFS: pod roots are copied file by file (slower pod starts, more disk)"
		c.Fix = "pass --data-dir on an APFS volume"
	}
	return c
}

// datastoreVerdict: rec is the data dir's datastore record (recorded: it
// exists); err is reading it, or the database's answer.
func datastoreVerdict(l datadir.Layout, rec datastore.Record, recorded bool, err error) Check {
	c := Check{Name: "datastore"}
	switch {
	case !recorded && err == nil:
		c.Status, c.Detail = Pass, "no cluster at "+l.Root+" yet: the first `k3sm server` makes it in the embedded SQLite, or in --datastore-endpoint"
	case !recorded:
		c.Status, c.Detail, c.Fix = Fail, err.Error(), "restore "+l.DatastoreFile()+" from a backup: it says which database holds the cluster"
	case rec.Kind() == datastore.SQLite && err != nil:
		c.Status, c.Detail = Fail, "embedded SQLite "+l.DBFile()+": "+err.Error()
		c.Fix = "restore it with `k3sm snapshot restore`, or start a new cluster with a new --data-dir"
	case rec.Kind() == datastore.SQLite:
		c.Status, c.Detail = Pass, "embedded SQLite "+l.DBFile()
	case err != nil:
		c.Status, c.Detail = Fail, rec.Endpoint()+" does not answer: "+err.Error()
		c.Fix = "start the database, or fix the host, port, user, password or TLS files of --datastore-endpoint (and --datastore-cafile/certfile/keyfile)"
	default:
		c.Status, c.Detail = Pass, rec.Endpoint()+" answers"
	}
	return c
}
