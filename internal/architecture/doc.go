// Package architecture holds no code: its tests enforce how the tree is
// layered (docs/architecture.md). The server side (internal/server,
// internal/upstream) may use everything; the agent side (internal/agent,
// internal/runtime, internal/netd) never imports the server's; shared
// packages import neither; the per-container shim, netd and runtimed link
// only what they are allowed; and docs/architecture.md's package table
// names every package.
package architecture
