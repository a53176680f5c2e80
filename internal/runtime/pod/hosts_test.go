package pod

import (
	"slices"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// spec.hostAliases are written as the kubelet writes them: the
// conformance spec looks for "123.45.67.89\tfoo\tbar".
func TestHostAliasesLines(t *testing.T) {
	if got := hostAliases(nil); got != "" {
		t.Errorf("no aliases: %q", got)
	}
	got := hostAliases([]*runtimev1.HostAlias{{Ip: "123.45.67.89", Hostnames: []string{"foo", "bar"}}, {Ip: "::2", Hostnames: []string{"v6"}}})
	want := "\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n::2\tv6\n"
	if got != want {
		t.Errorf("hostAliases = %q, want %q", got, want)
	}
}

// In a pod with init containers, a container never tried waits as
// PodInitializing, as the kubelet reports it; one being created is
// ContainerCreating.
func TestPodInitializingWaits(t *testing.T) {
	m := &Manager{}
	spec := &runtimev1.PodSpec{Uid: "u", Name: "p", Namespace: "ns",
		InitContainers: []*runtimev1.ContainerSpec{{Name: "init1"}, {Name: "init2"}},
		Containers:     []*runtimev1.ContainerSpec{{Name: "run1"}}}
	p := &managedPod{m: m, uid: "u", spec: spec}
	for _, c := range spec.InitContainers {
		p.init = append(p.init, m.newContainer(c, true, nil))
	}
	p.main = append(p.main, m.newContainer(spec.Containers[0], false, nil))
	p.init[0].hasRun = true // being created
	st := p.status()
	reasons := []string{st.InitContainerStatuses[0].GetState().GetWaiting().GetReason(),
		st.InitContainerStatuses[1].GetState().GetWaiting().GetReason(),
		st.ContainerStatuses[0].GetState().GetWaiting().GetReason()}
	if want := []string{"ContainerCreating", "PodInitializing", "PodInitializing"}; !slices.Equal(reasons, want) {
		t.Errorf("waiting reasons %v, want %v", reasons, want)
	}
}
