// Package architecture holds no code: its tests enforce how the tree is
// layered (docs/architecture.md). The server side (internal/server,
// internal/upstream) may use everything; the agent side (internal/agent,
// internal/runtime) never imports the server's; shared packages import
// neither; the per-container shim links nothing of Kubernetes.
package architecture
