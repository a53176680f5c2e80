package node

import goruntime "runtime"

// osOfNodes is the kubernetes.io/os value pods must select: this machine's.
func osOfNodes() string { return goruntime.GOOS }
