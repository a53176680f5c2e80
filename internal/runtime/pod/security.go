package pod

import (
	"fmt"
	"strings"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// addableCapabilities may be added back or beyond the default set
// (sandbox.DefaultCapabilities): that set, and CAP_SYS_PTRACE (kubectl
// debug's default profile adds it to a debug container), which reaches
// only the pod's own processes (its user and pid namespaces).
var addableCapabilities = append(append([]string{}, sandbox.DefaultCapabilities...), "CAP_SYS_PTRACE")

// refusal says why k3sm will not run container c of pod (the field and
// what to do), or "" when it may run.
func refusal(pod *runtimev1.PodSpec, c *runtimev1.ContainerSpec) string {
	switch {
	case pod.GetHostPid():
		return "spec.hostPID: true is refused: k3sm pods never share the node's process namespace; remove hostPID"
	case pod.GetHostIpc():
		return "spec.hostIPC: true is refused: k3sm pods never share the node's IPC namespace; remove hostIPC"
	}
	sc := c.GetSecurityContext()
	if sc.GetPrivileged() {
		return fmt.Sprintf("container %s: securityContext.privileged: true is refused: k3sm runs every pod in a user namespace without host privileges; remove privileged and add only the capabilities it needs from %s", c.GetName(), strings.Join(sandbox.DefaultCapabilities, ", "))
	}
	for _, a := range sc.GetCapabilitiesAdd() {
		n := sandbox.CapabilityName(a)
		ok := false
		for _, d := range addableCapabilities {
			ok = ok || d == n
		}
		if !ok {
			return fmt.Sprintf("container %s: securityContext.capabilities.add: %s is refused: k3sm allows adding only %s", c.GetName(), a, strings.Join(addableCapabilities, ", "))
		}
	}
	if p := sc.GetProcMount(); p != "" && p != "Default" {
		return fmt.Sprintf("container %s: securityContext.procMount: %s is refused: only Default is supported", c.GetName(), p)
	}
	return ""
}

// capabilities is the set container c's root keeps.
func capabilities(c *runtimev1.ContainerSpec) []string {
	sc := c.GetSecurityContext()
	drop := map[string]bool{}
	all := false
	for _, d := range sc.GetCapabilitiesDrop() {
		n := sandbox.CapabilityName(d)
		all = all || n == "ALL"
		drop[n] = true
	}
	var keep []string
	if !all {
		for _, d := range sandbox.DefaultCapabilities {
			if !drop[d] {
				keep = append(keep, d)
			}
		}
	}
	for _, a := range sc.GetCapabilitiesAdd() {
		n := sandbox.CapabilityName(a)
		dup := false
		for _, k := range keep {
			dup = dup || k == n
		}
		if !dup {
			keep = append(keep, n)
		}
	}
	return keep
}
