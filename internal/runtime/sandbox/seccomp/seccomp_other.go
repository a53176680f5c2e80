//go:build !linux

package seccomp

import (
	"errors"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

var errLinuxOnly = errors.New(field + ": seccomp filters exist only on Linux; on darwin the pod's boundary is its Seatbelt profile")

// RuntimeDefaultFor has no meaning off Linux.
func RuntimeDefaultFor(caps []string) ([]sandbox.SockFilter, error) { return nil, errLinuxOnly }

func compileLocalhost(body []byte, caps []string) ([]sandbox.SockFilter, error) {
	return nil, errLinuxOnly
}
