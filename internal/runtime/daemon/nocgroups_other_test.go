//go:build !linux

package daemon

import (
	"errors"
	"syscall"
)

const remountSysEnv = "K3SM_RUNTIME_TEST_REMOUNT_SYS"

func ownMountNamespace() *syscall.SysProcAttr { return nil }

func remountSys() error { return errors.New("a remounted /sys is a Linux test") }
