// Package version holds the k3sm build identity, set at link time by the Makefile.
package version

// Set with -ldflags -X by the Makefile.
var (
	Version    = "dev"
	GitCommit  = "unknown"
	Kubernetes = "v1.37.2"
)
