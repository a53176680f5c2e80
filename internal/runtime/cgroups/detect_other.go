//go:build !linux

package cgroups

// New elsewhere than Linux: no cgroups; the daemon's sampler enforces
// memory limits and CPU is a priority.
func New(opts Options) *Manager {
	return &Manager{reason: "cgroups are a Linux kernel feature", dirs: map[string]string{}}
}

// FavorDynamicChanges has nothing to set outside Linux.
func FavorDynamicChanges() (AttachMode, error) { return AttachMode{}, nil }

// ReadAttachMode finds no cgroup2 hierarchy outside Linux.
func ReadAttachMode(string) (AttachMode, error) { return AttachMode{}, nil }
