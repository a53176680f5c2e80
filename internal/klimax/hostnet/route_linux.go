//go:build linux

package hostnet

// newRouter: Linux ip(8); sudo only when not already root.
func newRouter() *Router { return &Router{Style: IPRoute2, Exec: LocalExec, Sudo: notRoot()} }
