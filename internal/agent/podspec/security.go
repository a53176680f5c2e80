package podspec

import (
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// securityContext merges the pod's securityContext into the container's as
// the kubelet does (a container field wins), for the runtime's sandbox.
func securityContext(pod *corev1.Pod, c *corev1.Container) *runtimev1.SecurityContext {
	out := &runtimev1.SecurityContext{}
	if ps := pod.Spec.SecurityContext; ps != nil {
		out.RunAsUser, out.RunAsGroup, out.FsGroup = ps.RunAsUser, ps.RunAsGroup, ps.FSGroup
		if ps.RunAsNonRoot != nil {
			out.RunAsNonRoot = *ps.RunAsNonRoot
		}
		out.SupplementalGroups = append(out.SupplementalGroups, ps.SupplementalGroups...)
		if ps.SeccompProfile != nil {
			out.SeccompProfile = seccompProfile(ps.SeccompProfile)
		}
	}
	if cs := c.SecurityContext; cs != nil {
		if cs.RunAsUser != nil {
			out.RunAsUser = cs.RunAsUser
		}
		if cs.RunAsGroup != nil {
			out.RunAsGroup = cs.RunAsGroup
		}
		if cs.RunAsNonRoot != nil {
			out.RunAsNonRoot = *cs.RunAsNonRoot
		}
		if cs.ReadOnlyRootFilesystem != nil {
			out.ReadOnlyRootFilesystem = *cs.ReadOnlyRootFilesystem
		}
		if cs.Privileged != nil {
			out.Privileged = *cs.Privileged
		}
		out.AllowPrivilegeEscalation = cs.AllowPrivilegeEscalation
		if cs.Capabilities != nil {
			for _, a := range cs.Capabilities.Add {
				out.CapabilitiesAdd = append(out.CapabilitiesAdd, string(a))
			}
			for _, d := range cs.Capabilities.Drop {
				out.CapabilitiesDrop = append(out.CapabilitiesDrop, string(d))
			}
		}
		if cs.SeccompProfile != nil {
			out.SeccompProfile = seccompProfile(cs.SeccompProfile)
		}
		if cs.ProcMount != nil {
			out.ProcMount = string(*cs.ProcMount)
		}
	}
	if proto.Equal(out, &runtimev1.SecurityContext{}) {
		return nil
	}
	return out
}

func seccompProfile(p *corev1.SeccompProfile) string {
	switch p.Type {
	case corev1.SeccompProfileTypeLocalhost:
		if p.LocalhostProfile != nil {
			return "Localhost/" + *p.LocalhostProfile
		}
		return "Localhost/"
	default:
		return string(p.Type)
	}
}
