//go:build darwin

package hostnet

// newRouter: macOS route(8); changes need sudo (it prompts on the terminal).
func newRouter() *Router { return &Router{Style: BSD, Exec: LocalExec, Sudo: true} }
