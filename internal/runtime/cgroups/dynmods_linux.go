//go:build linux

package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// FavorDynMods is the cgroup2 mount option (Linux 6.1+) that makes moving
// a process into a cgroup cheap. Without it the kernel's threadgroup lock
// waits for an RCU grace period on a write to cgroup.procs after a quiet
// moment: 6–12 ms on a 2-CPU machine, paid by every container start (its
// init joins its cgroups) and exec. With it, ~0.1 ms; fork and exit do a
// little more work instead. The lock is global: the option set on the
// cgroup2 hierarchy speeds up v1 hierarchies' moves as well.
const FavorDynMods = "favordynmods"

// AttachMode is the host's setting, from mountinfo: the first cgroup2
// mount, its superblock options, and whether FavorDynMods is among them.
type AttachMode struct {
	Mount   string   // "" when no cgroup2 hierarchy is mounted
	Options []string // superblock options, without rw/ro
	Favored bool
}

// ReadAttachMode reads the attach mode from a mountinfo file.
func ReadAttachMode(mountinfo string) (AttachMode, error) {
	var a AttachMode
	f, err := os.Open(mountinfo)
	if err != nil {
		return a, fmt.Errorf("read the mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup2" {
			continue
		}
		a.Mount = unescape(pf[4])
		for _, o := range strings.Split(qf[2], ",") {
			if o != "rw" && o != "ro" && o != "" {
				a.Options = append(a.Options, o)
			}
		}
		a.Favored = slices.Contains(a.Options, FavorDynMods)
		return a, nil
	}
	return a, sc.Err()
}

// Describe says what the mode means for pod starts.
func (a AttachMode) Describe() string {
	switch {
	case a.Mount == "":
		return "no cgroup2 hierarchy is mounted to carry " + FavorDynMods
	case a.Favored:
		return "cgroup2 " + FavorDynMods + " is set (" + a.Mount + "): moving a container's first process into its cgroups is cheap"
	}
	return "cgroup2 " + FavorDynMods + " is not set (" + a.Mount + "): each container start waits for an RCU grace period (~6–12 ms) to join its cgroups"
}

// FavorDynamicChanges sets FavorDynMods on the host's cgroup2 hierarchy,
// keeping every option it has (a reconfiguration sets the hierarchy's
// options to exactly those given), and returns the mode in force after.
// It needs root in the host's user and cgroup namespaces; elsewhere the
// kernel ignores the option, which the re-read mode shows.
func FavorDynamicChanges() (AttachMode, error) {
	a, err := ReadAttachMode("/proc/self/mountinfo")
	if err != nil || a.Favored {
		return a, err
	}
	if a.Mount == "" {
		return a, errors.New(a.Describe())
	}
	if err := reconfigure(a.Mount, append(slices.Clone(a.Options), FavorDynMods)); err != nil {
		if errors.Is(err, unix.EINVAL) {
			err = fmt.Errorf("%w (the option needs Linux 6.1 or later)", err)
		}
		return a, fmt.Errorf("set %s on %s: %w", FavorDynMods, a.Mount, err)
	}
	after, err := ReadAttachMode("/proc/self/mountinfo")
	if err == nil && !after.Favored {
		err = fmt.Errorf("set %s on %s: the kernel did not apply it (not the host's cgroup namespace?)", FavorDynMods, a.Mount)
	}
	return after, err
}

// reconfigure gives the cgroup2 superblock at mount exactly opts (flags,
// or key=value), without touching the mount's own flags. Nothing changes
// unless every option is accepted.
func reconfigure(mount string, opts []string) error {
	fd, err := unix.Fspick(unix.AT_FDCWD, mount, unix.FSPICK_CLOEXEC|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("fspick: %w", err)
	}
	defer unix.Close(fd)
	for _, o := range opts {
		k, v, hasValue := strings.Cut(o, "=")
		if hasValue {
			err = unix.FsconfigSetString(fd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fd, k)
		}
		if err != nil {
			return fmt.Errorf("option %s: %w", o, err)
		}
	}
	return unix.FsconfigReconfigure(fd)
}
