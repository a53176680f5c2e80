//go:build !unix

package controlplane

import "errors"

// lockDataDir is unsupported where there is no flock: k3sm runs on Linux and macOS.
func lockDataDir(string) (func(), error) {
	return nil, errors.New("data directory locking needs a unix system (Linux or macOS)")
}

func lockHeld(string) (bool, int, error) {
	return false, 0, errors.New("data directory locking needs a unix system (Linux or macOS)")
}
