//go:build !linux

package mounts

import "syscall"

// Namespaced is false: there are no mount namespaces here, Targets are
// paths inside the container's own root directory and Apply links them.
func Namespaced() bool { return false }

// SysProcAttr returns base unchanged: there is no mount namespace to start
// the process in (Apply makes symlinks instead).
func SysProcAttr(base *syscall.SysProcAttr) *syscall.SysProcAttr { return base }

// EnterArgv returns argv unchanged (there is no namespace to enter): the
// caller runs it in dir itself, as on Linux for a process that shares the
// caller's mount namespace.
func EnterArgv(pid int, dir string, argv []string) ([]string, error) { return argv, nil }

// Apply makes a symlink at each Target pointing to its Source (see
// applySymlinks); stageDir is unused.
func Apply(ms []Mount, stageDir string) error { return applySymlinks(ms) }

// StartWithoutCaps calls start: there are no capabilities to drop.
func StartWithoutCaps(start func() error) error { return start() }
