package cluster_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	kubeletoptions "k8s.io/kubernetes/cmd/kubelet/app/options"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// The golden kind configs, and every config klimax renders, pass the
// kubelet's own --node-labels validation: app.kubernetes.io/managed-by did
// not, and every real create died after kubeadm's 4-minute wait.
func TestKindConfigsPassTheKubelet(t *testing.T) {
	files, _ := filepath.Glob("testdata/kind-*.golden")
	if len(files) == 0 {
		t.Fatal("no kind config goldens")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var kc cluster.KindCluster
		if err := yaml.Unmarshal(data, &kc); err != nil {
			t.Fatal(err)
		}
		if err := clustertest.KubeletAccepts(kc); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	kc, err := cluster.KindConfig(cluster.Spec{Name: "dev", Slot: 3, NodeVersion: "v1.35.0", Region: "eu", Zone: "eu-1", Fleet: "f",
		DependsOn: []string{"mgmt"}, Labels: map[string]string{"example.com/team": "a", "node.kubernetes.io/pool": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := clustertest.KubeletAccepts(*kc); err != nil {
		t.Error(err)
	}
	if kc.Nodes[0].Labels[cluster.LabelManagedBy] != "klimax" || cluster.LabelManagedBy != "klimax.dev/managed-by" {
		t.Errorf("managed-by label: %v", kc.Nodes[0].Labels)
	}
}

// klimax's check agrees with the kubelet's flag validation on every key it
// is shown: it refuses exactly what the kubelet refuses.
func TestValidateNodeLabelAgreesWithKubelet(t *testing.T) {
	keys := []string{"team", "example.com/team", "app.kubernetes.io/managed-by", "kubernetes.io/hostname", "kubernetes.io/foo",
		"node.kubernetes.io/pool", "sub.node.kubernetes.io/x", "kubelet.kubernetes.io/x", "topology.kubernetes.io/region",
		"topology.kubernetes.io/rack", "k8s.io/x", "foo.k8s.io/x", "node-role.kubernetes.io/worker", "beta.kubernetes.io/os",
		"kubernetes.io.example.com/x", "notk8s.io/x", "klimax.dev/managed-by", "bad key", "-a", "a/b/c", strings.Repeat("k", 64)}
	values := []string{"", "v", "bad value", strings.Repeat("v", 64), "-x"}
	for _, k := range keys {
		for _, v := range values {
			kubelet := kubeletoptions.ValidateKubeletFlags(&kubeletoptions.KubeletFlags{NodeLabels: map[string]string{k: v}})
			ours := cluster.ValidateNodeLabel("-l", k, v)
			if (kubelet == nil) != (ours == nil) {
				t.Errorf("%q=%q: kubelet %v, klimax %v", k, v, kubelet, ours)
			}
		}
	}
}

// -l labels, region and zone the kubelet would refuse are refused before
// kind runs, naming the field and the fix; nothing is created.
func TestCreateRefusesLabelsTheKubeletRefuses(t *testing.T) {
	for _, tc := range []struct {
		o    cluster.CreateOptions
		want []string
	}{
		{cluster.CreateOptions{Labels: map[string]string{"app.kubernetes.io/part-of": "x"}}, []string{"label", "app.kubernetes.io/part-of", "kubelet", "example.com/part-of"}},
		{cluster.CreateOptions{Labels: map[string]string{"k8s.io/x": "y"}}, []string{"k8s.io/x", "fix:"}},
		{cluster.CreateOptions{Region: "eu west"}, []string{"region", "eu west", "fix:"}},
		{cluster.CreateOptions{Zone: strings.Repeat("z", 64)}, []string{"zone", "fix:"}},
		{cluster.CreateOptions{Labels: map[string]string{cluster.LabelManagedBy: "me"}}, []string{"managed by klimax"}},
	} {
		e := newEnv(t)
		tc.o.Name = "dev"
		_, err := e.M.Create(context.Background(), tc.o)
		if err == nil {
			t.Errorf("%+v accepted", tc.o)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q lacks %q", tc.o, err, w)
			}
		}
		if calls := e.Kind.Calls(); len(calls) != 0 {
			t.Errorf("%+v: commands ran: %q", tc.o, calls)
		}
	}
}

// The regression itself: a node labelled app.kubernetes.io/managed-by (what
// klimax rendered before) is refused by the fake exactly as by the kubelet,
// and nothing is left behind.
func TestFakeKindRefusesTheOldManagedByLabel(t *testing.T) {
	kc, err := cluster.KindConfig(cluster.Spec{Name: "dev", Slot: 1, NodeVersion: "v1.35.0"})
	if err != nil {
		t.Fatal(err)
	}
	kc.Nodes[0].Labels["app.kubernetes.io/managed-by"] = "klimax"
	err = clustertest.KubeletAccepts(*kc)
	if err == nil || !strings.Contains(err.Error(), "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [app.kubernetes.io/managed-by]") {
		t.Fatalf("kubelet check: %v", err)
	}
	e := newEnv(t)
	cfg, _ := kc.Render()
	_, err = e.Kind.Run(context.Background(), []string{"kind", "create", "cluster", "--name", "dev", "--config", "-"}, vmOpts(cfg))
	if err == nil || !strings.Contains(err.Error(), "failed to init node with kubeadm") {
		t.Errorf("fake kind create: %v", err)
	}
	if ex, _ := e.M.Existing(context.Background()); len(ex) != 0 {
		t.Errorf("a refused create left %v", ex)
	}
}

func vmOpts(stdin []byte) vm.RunOptions {
	return vm.RunOptions{Timeout: time.Minute, Stdin: bytes.NewReader(stdin)}
}
