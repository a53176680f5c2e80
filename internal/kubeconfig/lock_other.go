//go:build !unix

package kubeconfig

// lockFile is a no-op where flock is unavailable; the in-process mutex still
// serialises callers within one process.
func lockFile(string) (func(), error) { return func() {}, nil }
