// Package mounts owns how a container's volumes become visible at their
// mountPath: on Linux the shim is started in a mount namespace of its own
// (plus a user namespace when the daemon is not root) and bind-mounts each
// volume there before it starts the workload, so the host and other pods
// never see them; elsewhere a documented fallback applies. It links only the
// standard library and x/sys, because the shim imports it.
package mounts

// Mount makes Source (a host path: a volume directory, a file inside one, or
// a hostPath) visible at Target (an absolute path as the container's
// processes see it).
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// IDMapped: Source is a directory that outlives the pod (hostPath, a
	// PersistentVolume). In a pod's user namespace it is mounted idmapped,
	// so a file keeps on disk the ids the pod sees (as with the kubelet's
	// user-namespaced pods): any later pod, whatever its id range, finds
	// its files owned as it left them.
	IDMapped bool `json:"idMapped,omitempty"`
}
