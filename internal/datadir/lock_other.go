//go:build !unix

package datadir

import "errors"

// Lock is unsupported where there is no flock: k3sm runs on Linux and macOS.
func Lock(string, string) (func(), error) {
	return nil, errors.New("data directory locking needs a unix system (Linux or macOS)")
}

func LockHeld(string) (bool, int, error) {
	return false, 0, errors.New("data directory locking needs a unix system (Linux or macOS)")
}
