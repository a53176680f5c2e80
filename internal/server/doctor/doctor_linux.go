package doctor

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/limits"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

func osName() string { return "linux" }

func kernelChecks(_, dataDir string) []Check {
	euid := os.Geteuid()
	maxNS, _ := strconv.Atoi(readTrim("/proc/sys/user/max_user_namespaces"))
	fs, _ := os.ReadFile("/proc/filesystems")
	abi, err := sandbox.LandlockVersion()
	socket := datadir.New(dataDir).RuntimeSocket()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	lim := limits.Ask(ctx, socket)
	cancel()
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
		cgroupVerdict(lim, socket, euid),
		attachVerdict(mode, merr, euid),
		nftVerdict(tables, nerr, euid),
	}
}

// readTrim returns a /proc file's content, "" when it does not exist.
func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
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
