//go:build !linux

package cgroups

// New elsewhere than Linux: no cgroups; the daemon's sampler enforces
// memory limits and CPU is a priority.
func New(opts Options) *Manager {
	return &Manager{reason: "cgroups are a Linux kernel feature", cause: CauseNotLinux, dirs: map[string]string{}}
}

// Detect is what New finds: nothing outside Linux.
func Detect(opts Options) Support { return New(opts).Support() }

// FavorDynamicChanges has nothing to set outside Linux.
func FavorDynamicChanges() (AttachMode, error) { return AttachMode{}, nil }

// ReadAttachMode finds no cgroup2 hierarchy outside Linux.
func ReadAttachMode(string) (AttachMode, error) { return AttachMode{}, nil }
