//go:build !darwin && !linux

package hostnet

// newRouter: other systems are not supported hosts; the ip(8) dialect is the
// closest, and every command fails clearly if the tool is missing.
func newRouter() *Router { return &Router{Style: IPRoute2, Exec: LocalExec, Sudo: notRoot()} }
