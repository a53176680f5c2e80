package pod

// Validation: the pod specs the lifecycle refuses to run.

import (
	"fmt"
	"path/filepath"
	"slices"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// validate refuses specs the lifecycle cannot run.
func validate(spec *runtimev1.PodSpec) error {
	if spec == nil {
		return &InvalidSpecError{"pod: spec is required"}
	}
	if spec.GetUid() == "" || filepath.Base(spec.GetUid()) != spec.GetUid() || spec.GetUid() == "." || spec.GetUid() == ".." {
		return &InvalidSpecError{fmt.Sprintf("pod.uid %q: must be a non-empty uid without slashes", spec.GetUid())}
	}
	if spec.GetName() == "" || spec.GetNamespace() == "" {
		return &InvalidSpecError{"pod.name and pod.namespace are required"}
	}
	if len(spec.GetContainers()) == 0 {
		return &InvalidSpecError{"pod.containers: at least one container is required"}
	}
	seen := map[string]bool{}
	for _, c := range allSpecs(spec) {
		if c.GetName() == "" || filepath.Base(c.GetName()) != c.GetName() || c.GetName() == "." || c.GetName() == ".." {
			return &InvalidSpecError{fmt.Sprintf("container name %q: must be a DNS label", c.GetName())}
		}
		if seen[c.GetName()] {
			return &InvalidSpecError{fmt.Sprintf("container name %q is used twice", c.GetName())}
		}
		seen[c.GetName()] = true
		if c.GetImage() == "" {
			return &InvalidSpecError{fmt.Sprintf("container %q: image is required (an OCI reference, or %q with an absolute command)", c.GetName(), NativeImage)}
		}
	}
	for _, ec := range spec.GetEphemeralContainers() {
		if ec.GetContainer() == nil {
			return &InvalidSpecError{"pod.ephemeral_containers: container is required"}
		}
		if t := ec.GetTargetContainerName(); t != "" && !slices.ContainsFunc(append(slices.Clone(spec.GetInitContainers()), spec.GetContainers()...),
			func(c *runtimev1.ContainerSpec) bool { return c.GetName() == t }) {
			return &InvalidSpecError{fmt.Sprintf("ephemeral container %q: target container %q is not a container of the pod", ec.GetContainer().GetName(), t)}
		}
	}
	return nil
}

// allSpecs lists the init, regular and ephemeral containers of spec.
func allSpecs(spec *runtimev1.PodSpec) []*runtimev1.ContainerSpec {
	out := append(slices.Clone(spec.GetInitContainers()), spec.GetContainers()...)
	for _, ec := range spec.GetEphemeralContainers() {
		out = append(out, ec.GetContainer())
	}
	return out
}
