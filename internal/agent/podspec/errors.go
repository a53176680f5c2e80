package podspec

import "fmt"

// The three ways a translation fails. The node reports each as the kubelet
// does and retries; nothing of the pod reaches the runtime.

// ConfigError is a pod the node cannot start because something a container
// references is missing (a ConfigMap key, a Secret, a named port); the
// kubelet reports it as CreateContainerConfigError and retries.
type ConfigError struct {
	Container string
	Err       error
}

func (e *ConfigError) Error() string { return e.Err.Error() }

// VolumeError is a volume the node cannot set up yet (a missing ConfigMap,
// an unbound claim, a refused hostPath). As with the kubelet the pod stays
// ContainerCreating, a FailedMount event says why, and the node retries.
type VolumeError struct {
	Volume string
	Err    error
}

func (e *VolumeError) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", e.Volume, e.Err)
}

// TransientError is a pod the node could not translate because the API did
// not answer (a timeout, a 5xx, a refused connection): nothing is wrong with
// the pod or what it references, so it is neither a CreateContainerConfigError
// nor a FailedMount. A running pod keeps its status; a pod not started yet is
// retried with backoff.
type TransientError struct{ Err error }

func (e *TransientError) Error() string {
	return fmt.Sprintf("the API server did not answer (will retry): %v", e.Err)
}
func (e *TransientError) Unwrap() error { return e.Err }
