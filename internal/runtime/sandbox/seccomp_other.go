//go:build !linux

package sandbox

import "errors"

// LoadSeccomp is Linux-only: there is no seccomp elsewhere.
func LoadSeccomp(filter []SockFilter) error {
	return errors.New("seccomp is Linux-only: a Spec with a Seccomp filter cannot be applied on this OS")
}
