package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/cluster/clustertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
	"github.com/k3sm-dev/k3sm/internal/klimax/docker/dockertest"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// onlyPrefix shows the test its own clusters only: the engine may run
// someone else's kind clusters, which this test must never touch.
type onlyPrefix struct {
	cluster.DockerInventory
	prefix string
}

func (o onlyPrefix) ControlPlanes(ctx context.Context) ([]cluster.NodeContainer, error) {
	all, err := o.DockerInventory.ControlPlanes(ctx)
	var out []cluster.NodeContainer
	for _, n := range all {
		if strings.HasPrefix(n.Cluster, o.prefix) {
			out = append(out, n)
		}
	}
	return out, err
}

type kindStub map[string]int // cluster -> API port

func (k kindStub) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	if len(argv) == 5 && strings.Join(argv[:4], " ") == "kind get kubeconfig --name" {
		if port, ok := k[argv[4]]; ok {
			return vm.Result{Stdout: []byte(clustertest.Kubeconfig(argv[4], port))}, nil
		}
	}
	return vm.Result{}, fmt.Errorf("unexpected %q", argv)
}

// TestIntegrationDownUpHostClusters: `down` with the host driver stops the
// node containers of klimax's clusters on the real engine, leaves a user's
// kind cluster on a slot port (no klimax.dev/managed-by) running, and `up`
// starts klimax's again.
func TestIntegrationDownUpHostClusters(t *testing.T) {
	c := dockertest.Engine(t)
	image := "klimax-test/fake-node:" + dockertest.UniqueName("du")
	dockertest.RegistryImage(t, c, image)
	prefix := fmt.Sprintf("kx%d-", dockertest.FreePort(t))
	ours, theirs := prefix+"ours", prefix+"theirs"
	stub := kindStub{}
	stub[ours] = dockertest.KindControlPlaneOnSlotPort(t, c, image, ours, ours+"-control-plane")
	dockertest.KindNode(t, c, image, ours, "worker", ours+"-worker", 0)
	stub[theirs] = dockertest.KindControlPlaneOnSlotPort(t, c, image, theirs, theirs+"-control-plane")

	kubes := clustertest.NewKubes()
	api, _ := kubes.New([]byte(fmt.Sprintf("server: https://127.0.0.1:%d", stub[ours])))
	api.(*clustertest.API).Labels[cluster.LabelManagedBy] = cluster.ManagedByValue
	home := t.TempDir()
	plat := &fakePlatform{}
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		app := &App{Streams: Streams{In: strings.NewReader(""), Out: &out, Err: &errb}, Home: home,
			NewPlatform: func(*config.Config) (Platform, error) { return plat, nil },
			NewClusters: func(cfg *config.Config, p Platform) (*cluster.Manager, error) {
				return &cluster.Manager{Config: cfg, Runner: stub, Inventory: onlyPrefix{prefix: prefix}, NewKube: kubes.New,
					APIHost: func(context.Context) (string, error) { return "127.0.0.1", nil }, KubeDir: home + "/.kube/klimax"}, nil
			}}
		root := NewRoot(app)
		root.SetArgs(args)
		err := root.ExecuteContext(context.Background())
		if err != nil {
			errb.WriteString("Error: " + err.Error())
		}
		return out.String(), errb.String(), ExitCode(err)
	}
	out, errs, code := run("down")
	if code != 0 || !strings.Contains(out, "stopped cluster(s) "+ours) || !strings.Contains(out, "did not create: "+theirs) {
		t.Fatalf("down: %d %s %s", code, out, errs)
	}
	for ctr, want := range map[string]string{ours + "-control-plane": "exited", ours + "-worker": "exited", theirs + "-control-plane": "running"} {
		if got := dockertest.State(t, c, ctr); got != want {
			t.Errorf("after down %s is %s, want %s", ctr, got, want)
		}
	}
	out, errs, code = run("up")
	if code != 0 || !strings.Contains(out, "started cluster(s) "+ours+" again") {
		t.Fatalf("up: %d %s %s", code, out, errs)
	}
	for _, ctr := range []string{ours + "-control-plane", ours + "-worker", theirs + "-control-plane"} {
		if got := dockertest.State(t, c, ctr); got != "running" {
			t.Errorf("after up %s is %s", ctr, got)
		}
	}
}
