//go:build !linux

package cgroups

// New elsewhere than Linux: no cgroups; the daemon's sampler enforces
// memory limits and CPU is a priority.
func New(opts Options) *Manager {
	return &Manager{reason: "cgroups are a Linux kernel feature", dirs: map[string]string{}}
}

// AttachMode is Linux's cgroup2 setting; elsewhere there is none.
type AttachMode struct {
	Mount   string
	Options []string
	Favored bool
}

// Describe says there are no cgroups.
func (AttachMode) Describe() string { return "cgroups are a Linux kernel feature" }

// FavorDynamicChanges has nothing to set outside Linux.
func FavorDynamicChanges() (AttachMode, error) { return AttachMode{}, nil }

// ReadAttachMode finds no cgroup2 hierarchy outside Linux.
func ReadAttachMode(string) (AttachMode, error) { return AttachMode{}, nil }
