//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ReadAttachMode reads the attach mode from a mountinfo file.
func ReadAttachMode(mountinfo string) (AttachMode, error) {
	var a AttachMode
	err := scanMounts(mountinfo, func(m mountEntry) bool {
		if m.fstype != "cgroup2" {
			return true
		}
		a.Mount = m.point
		for _, o := range m.superopts {
			if o != "rw" && o != "ro" && o != "" {
				a.Options = append(a.Options, o)
			}
		}
		a.Favored = slices.Contains(a.Options, FavorDynMods)
		return false
	})
	return a, err
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
