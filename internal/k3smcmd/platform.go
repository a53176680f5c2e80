package k3smcmd

import "runtime"

// The platform an image built from scratch is for: this node's.
func goos() string   { return runtime.GOOS }
func goarch() string { return runtime.GOARCH }
