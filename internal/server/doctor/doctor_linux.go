package doctor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

func osName() string { return "linux" }

func kernelChecks(string) []Check {
	euid := os.Geteuid()
	maxNS, _ := strconv.Atoi(readTrim("/proc/sys/user/max_user_namespaces"))
	fs, _ := os.ReadFile("/proc/filesystems")
	abi, err := sandbox.LandlockVersion()
	v2, own, writable, controllers := cgroupState()
	tables, nerr := nftTables()
	mode, merr := cgroups.ReadAttachMode("/proc/self/mountinfo")
	why := ""
	if euid != 0 {
		_, _, why = sandbox.RootlessIDs()
	}
	return []Check{
		usernsVerdict(maxNS, readTrim("/proc/sys/kernel/unprivileged_userns_clone"), readTrim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"), euid),
		overlayVerdict(string(fs)),
		landlockVerdict(abi, err),
		podIDsVerdict(euid, why),
		cgroupVerdict(v2, own, writable, controllers),
		attachVerdict(mode, merr, euid),
		nftVerdict(tables, nerr, euid),
	}
}

// readTrim returns a /proc file's content, "" when it does not exist.
func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// cgroupState: whether /sys/fs/cgroup is cgroup v2, this process's cgroup,
// and whether this process may create cgroups below it.
func cgroupState() (v2 bool, own string, writable bool, controllers string) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return false, "", false, ""
	}
	raw, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(raw), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = filepath.Join("/sys/fs/cgroup", p)
		}
	}
	if own == "" {
		return true, "(unknown)", false, ""
	}
	writable = unix.Access(own, unix.W_OK) == nil && unix.Access(filepath.Join(own, "cgroup.procs"), unix.W_OK) == nil
	return true, own, writable, readTrim(filepath.Join(own, "cgroup.controllers"))
}

// nftTables lists the nftables tables over netlink (needs CAP_NET_ADMIN).
func nftTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	ts, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out, nil
}

func diskUsage(path string) (DiskUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return DiskUsage{}, err
	}
	bs := uint64(st.Bsize)
	return DiskUsage{Total: st.Blocks * bs, Avail: st.Bavail * bs, Inodes: st.Files, InodesFree: st.Ffree}, nil
}

// ntpSynced reads the kernel's NTP status (adjtimex, read-only): no network.
func ntpSynced() (synced, known bool) {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	if err != nil {
		return false, false
	}
	return state != unix.TIME_ERROR && tx.Status&unix.STA_UNSYNC == 0, true
}
