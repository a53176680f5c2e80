package cluster

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	goldenfile "github.com/k3sm-dev/k3sm/internal/golden"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, name+".golden", got)
}

func TestKindConfigGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		spec   Spec
	}{
		{"kind-lima-slot1", Spec{Name: "dev", Slot: 1, NodeVersion: "v1.35.0", Region: "eu-west", Zone: "eu-west-1a",
			Fleet: "demo", Labels: map[string]string{"team": "a"}, ListenAddress: "0.0.0.0", APIHost: "192.168.64.3"}},
		{"kind-host-slot42", Spec{Name: "staging", Slot: 42, NodeVersion: "v1.34.2", ListenAddress: "127.0.0.1", APIHost: "127.0.0.1"}},
	} {
		kc, err := KindConfig(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		out, err := kc.Render()
		if err != nil {
			t.Fatal(err)
		}
		golden(t, tc.golden, out)
		// The rendered YAML must decode back into the same structure.
		var back KindCluster
		if err := yaml.Unmarshal(out, &back); err != nil || back.Networking != kc.Networking || back.Nodes[0].Labels[LabelSlot] != kc.Nodes[0].Labels[LabelSlot] {
			t.Errorf("round trip: %v %+v", err, back)
		}
	}
	if _, err := KindConfig(Spec{Name: "a;b", Slot: 1}); err == nil {
		t.Error("bad name accepted")
	}
	if _, err := KindConfig(Spec{Name: "a", Slot: 100}); err == nil {
		t.Error("slot 100 accepted")
	}
	if _, err := KindConfig(Spec{Name: "a", Slot: 1, APIHost: "$(reboot)"}); err == nil {
		t.Error("non-IP API host accepted")
	}
}

func TestHostsTOMLGolden(t *testing.T) {
	var all bytes.Buffer
	for _, m := range config.DefaultMirrors() {
		h := HostsTOML(m)
		all.WriteString("### " + h.Path + "\n")
		all.Write(h.Content)
	}
	golden(t, "hosts-toml", all.Bytes())
	if h := HostsTOML(config.DefaultMirrors()[0]); h.Path != "/etc/containerd/certs.d/docker.io/hosts.toml" {
		t.Errorf("docker hub path %s", h.Path)
	}
}

func TestMetalLBObjectsGolden(t *testing.T) {
	var buf bytes.Buffer
	for _, o := range MetalLBObjects(7, "172.30") {
		out, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(out)
	}
	golden(t, "metallb-slot7", buf.Bytes())
	back, err := ParseManifest(buf.Bytes())
	if err != nil || len(back) != 2 || back[0].GetKind() != "IPAddressPool" || back[1].GetKind() != "L2Advertisement" {
		t.Errorf("parse back: %v %d", err, len(back))
	}
}

func TestCorefileEditGolden(t *testing.T) {
	rs := []config.DNSResolver{
		{Domain: "runlocal.dev", Resolvers: []string{"8.8.8.8", "8.8.4.4"}},
		{Domain: "corp.example", Resolvers: []string{"10.0.0.53:5353"}},
	}
	for _, name := range []string{"corefile-kind", "corefile-extra"} {
		in, err := os.ReadFile(filepath.Join("testdata", name+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		out, err := EditCorefile(string(in), rs)
		if err != nil {
			t.Fatal(err)
		}
		golden(t, name+"-edited", []byte(out))
		again, err := EditCorefile(out, rs)
		if err != nil || again != out {
			t.Errorf("%s: second edit is not a no-op:\n%s", name, again)
		}
		if name == "corefile-extra" {
			for _, keep := range []string{"# added by the user: must survive", "10.0.0.1 db.example.internal", "example.internal:53 {"} {
				if !strings.Contains(out, keep) {
					t.Errorf("user content %q lost", keep)
				}
			}
			if strings.Contains(out, "old.dev") {
				t.Error("stale klimax block for old.dev kept")
			}
		}
		// Removing all resolvers restores the user's content minus our blocks.
		cleared, err := EditCorefile(out, nil)
		if err != nil || strings.Contains(cleared, "klimax:") {
			t.Errorf("clear: %v\n%s", err, cleared)
		}
		if name == "corefile-kind" && cleared != string(in) {
			t.Errorf("clear did not restore the original:\n%q\n%q", cleared, in)
		}
	}
}

func TestCorefileEditRefusesForeignDuplicateZone(t *testing.T) {
	cf := ".:53 {\n    forward . /etc/resolv.conf\n}\nrunlocal.dev:53 {\n    forward . 1.1.1.1\n}\n"
	_, err := EditCorefile(cf, []config.DNSResolver{{Domain: "runlocal.dev", Resolvers: []string{"8.8.8.8"}}})
	if err == nil || !strings.Contains(err.Error(), "runlocal.dev") {
		t.Errorf("err = %v", err)
	}
	if _, err := EditCorefile(cf+"# klimax:begin x.dev\nx.dev:53 {\n", nil); err == nil {
		t.Error("unterminated block accepted")
	}
}

func TestMetricsServerTweaks(t *testing.T) {
	dep := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "metrics-server"},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"name": "metrics-server", "args": []any{"--secure-port=10250"}}}}}}}}
	objs := []*unstructured.Unstructured{dep}
	for i := 0; i < 2; i++ {
		if err := MetricsServerTweaks(objs, true); err != nil {
			t.Fatal(err)
		}
	}
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args := cs[0].(map[string]any)["args"].([]any)
	if len(args) != 2 || args[1] != "--kubelet-insecure-tls" {
		t.Errorf("args %v", args)
	}
	if err := MetricsServerTweaks(nil, true); err == nil {
		t.Error("missing deployment accepted")
	}
}

func TestValidateNameAndLabels(t *testing.T) {
	for _, ok := range []string{"dev", "a", "team-a-1", "staging-2", strings.Repeat("a", 40)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Dev", "-a", "a-", "a_b", "a.b", "a b", "$(id)", "a;rm -rf", "x;rm", strings.Repeat("a", 41), "ä"} {
		if err := ValidateName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if !strings.Contains(err.Error(), "cluster name") || !strings.Contains(err.Error(), "lower-case letters") {
			t.Errorf("%q: error names neither the field nor the fix: %v", bad, err)
		}
	}
	set, rm, err := ParseLabels([]string{"team=a,env=dev", "old-"})
	if err != nil || set["team"] != "a" || set["env"] != "dev" || len(rm) != 1 || rm[0] != "old" {
		t.Errorf("%v %v %v", set, rm, err)
	}
	for _, bad := range []string{"noeq", "bad key=v", "k=bad value", "k=" + strings.Repeat("v", 64)} {
		if _, _, err := ParseLabels([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestIsKubernetesLabel(t *testing.T) {
	for k, want := range map[string]bool{"kubernetes.io/x": true, "app.kubernetes.io/x": true, "k8s.io/x": true, "x.k8s.io/y": true,
		"notkubernetes.io/x": false, "example.com/x": false, "team": false, "kubernetes.io.example.com/x": false} {
		if got := IsKubernetesLabel(k); got != want {
			t.Errorf("%s: %v", k, got)
		}
	}
}
