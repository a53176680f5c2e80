package pod

import (
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
