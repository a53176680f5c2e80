package node

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

type fakeDiskRuntime struct {
	mu      sync.Mutex
	images  []*runtimev1.Image
	pods    *runtimev1.ListPodsResponse
	removed []string
	onRm    func(size int64)
}

func (f *fakeDiskRuntime) ListPods(context.Context, *runtimev1.ListPodsRequest) (*runtimev1.ListPodsResponse, error) {
	return f.pods, nil
}
func (f *fakeDiskRuntime) ListImages(context.Context) ([]*runtimev1.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*runtimev1.Image(nil), f.images...), nil
}
func (f *fakeDiskRuntime) RemoveImage(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, img := range f.images {
		if img.GetId() == id {
			f.images = append(f.images[:i], f.images[i+1:]...)
			f.removed = append(f.removed, id)
			if f.onRm != nil {
				f.onRm(img.GetSizeBytes())
			}
			return nil
		}
	}
	return io.EOF
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func testDisk(t *testing.T, rt diskRuntime, fs *fsStats) (*diskManager, *record.FakeRecorder, *fakeClock) {
	t.Helper()
	cfg := diskpolicy.Default()
	rec := record.NewFakeRecorder(100)
	d, err := newDiskManager(cfg, "/data", "n1", rt, rec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{time.Unix(1_000_000, 0)}
	d.now = clock.now
	d.statfs = func(string) (fsStats, error) { return *fs, nil }
	// The machine's own memory must not decide a disk test.
	d.mem.read = func() (pressure.Memory, error) {
		return pressure.Memory{AvailableBytes: 8 << 30, TotalBytes: 16 << 30}, nil
	}
	return d, rec, clock
}

func diskCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeDiskPressure {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// DiskPressure follows the hard eviction thresholds and the transition
// period, with the kubelet's reasons and messages.
func TestDiskPressureCondition(t *testing.T) {
	fs := &fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
	d, rec, clock := testDisk(t, &fakeDiskRuntime{pods: &runtimev1.ListPodsResponse{}}, fs)
	var got []*corev1.Node
	d.setNode(nodeObject(Config{NodeConfig: roleconfig.NodeConfig{Name: "n1"}}, &runtimev1.GetRuntimeInfoResponse{}), func(n *corev1.Node) { got = append(got, n) })
	if c := diskCondition(d.node); c.Status != corev1.ConditionFalse || c.Reason != "KubeletHasNoDiskPressure" || c.Message != "kubelet has no disk pressure" {
		t.Fatalf("initial condition %+v", c)
	}
	ctx := context.Background()
	d.housekeeping(ctx)
	if len(got) != 0 {
		t.Fatalf("no change, yet %d updates", len(got))
	}
	for _, tc := range []struct {
		name string
		fs   fsStats
	}{
		{"nodefs.available<10%", fsStats{CapacityBytes: 1000, AvailableBytes: 90, Inodes: 1000, InodesFree: 500}},
		{"imagefs.available<15% (same filesystem)", fsStats{CapacityBytes: 1000, AvailableBytes: 140, Inodes: 1000, InodesFree: 500}},
		{"nodefs.inodesFree<5%", fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 40}},
	} {
		got = nil
		*fs = tc.fs
		clock.t = clock.t.Add(time.Hour) // past the transition period
		d.housekeeping(ctx)
		if len(got) != 1 {
			t.Fatalf("%s: %d updates", tc.name, len(got))
		}
		c := diskCondition(got[0])
		if c.Status != corev1.ConditionTrue || c.Reason != "KubeletHasDiskPressure" || c.Message != "kubelet has disk pressure" || !c.LastTransitionTime.Time.Equal(clock.t) {
			t.Fatalf("%s: condition %+v", tc.name, c)
		}
		if ev := strings.Join(events(rec), "\n"); !strings.Contains(ev, "EvictionThresholdMet") {
			t.Errorf("%s: events %q", tc.name, ev)
		}
		// Free again: still True within the transition period, then False.
		*fs = fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
		clock.t = clock.t.Add(time.Minute)
		d.housekeeping(ctx)
		if len(got) != 1 {
			t.Fatalf("%s: condition changed within the transition period", tc.name)
		}
		clock.t = clock.t.Add(5 * time.Minute)
		d.housekeeping(ctx)
		if len(got) != 2 || diskCondition(got[1]).Status != corev1.ConditionFalse || diskCondition(got[1]).Reason != "KubeletHasNoDiskPressure" {
			t.Fatalf("%s: after the transition period: %d updates", tc.name, len(got))
		}
		// The other conditions are kept.
		if len(got[1].Status.Conditions) != 5 {
			t.Fatalf("%s: %d conditions", tc.name, len(got[1].Status.Conditions))
		}
	}
}

// Image GC: above 85 % of the image filesystem, unused images go least
// recently used first until usage is below 80 %; never one a pod uses,
// never one younger than the minimum age.
func TestImageGC(t *testing.T) {
	img := func(id, tag string, size int64) *runtimev1.Image {
		return &runtimev1.Image{Id: id, RepoTags: []string{tag}, SizeBytes: size}
	}
	rt := &fakeDiskRuntime{
		images: []*runtimev1.Image{
			img("sha256:running", "reg/running:v1", 100),
			img("sha256:pending", "reg/pending:v1", 100), // a pod not started yet refers to it
			img("sha256:old", "reg/old:v1", 30),
			img("sha256:recent", "reg/recent:v1", 30),
			img("sha256:spare", "reg/spare:v1", 30),
		},
	}
	fs := &fsStats{CapacityBytes: 1000, AvailableBytes: 500, Inodes: 1000, InodesFree: 500}
	rt.onRm = func(size int64) { fs.AvailableBytes += uint64(size) }
	d, rec, clock := testDisk(t, rt, fs)
	ctx := context.Background()
	use := func(images ...string) {
		resp := &runtimev1.ListPodsResponse{}
		for _, im := range images {
			resp.Pods = append(resp.Pods, &runtimev1.PodStatus{})
			resp.Specs = append(resp.Specs, &runtimev1.PodSpec{Containers: []*runtimev1.ContainerSpec{{Image: im}}})
		}
		rt.pods = resp
	}
	// "recent" is used later than "old"; both stop being used.
	use("reg/running:v1", "reg/pending:v1", "reg/old:v1", "reg/recent:v1")
	d.detectImages(ctx)
	clock.t = clock.t.Add(time.Minute)
	use("reg/running:v1", "reg/pending:v1", "reg/recent:v1")
	d.detectImages(ctx)
	clock.t = clock.t.Add(time.Minute)
	rt.pods = &runtimev1.ListPodsResponse{
		Pods: []*runtimev1.PodStatus{{ContainerStatuses: []*runtimev1.ContainerStatus{{ImageDigest: "sha256:running"}}}},
		// A pod not started yet: only its spec names the image.
		Specs: []*runtimev1.PodSpec{{Containers: []*runtimev1.ContainerSpec{{Image: "reg/running:v1"}}}, {InitContainers: []*runtimev1.ContainerSpec{{Image: "reg/pending:v1"}}}},
	}
	rt.pods.Pods = append(rt.pods.Pods, &runtimev1.PodStatus{})
	d.detectImages(ctx)
	// A new image, younger than the minimum age (2 m).
	rt.images = append(rt.images, img("sha256:young", "reg/young:v1", 30))
	clock.t = clock.t.Add(time.Minute)
	d.detectImages(ctx)

	// Below the high threshold nothing happens.
	fs.AvailableBytes = 160 // 84 % used
	if err := d.garbageCollect(ctx); err != nil || len(rt.removed) != 0 {
		t.Fatalf("below 85 %%: err %v, removed %v", err, rt.removed)
	}
	// 86 % used: free 60 bytes to reach 80 %: spare (never used), then old
	// (least recently used).
	fs.AvailableBytes = 140
	if err := d.garbageCollect(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Join(rt.removed, ",") != "sha256:spare,sha256:old" {
		t.Fatalf("removed %v, want spare then old", rt.removed)
	}
	// 95 % used: recent is all that may go; not enough: FreeDiskSpaceFailed.
	fs.AvailableBytes = 50
	err := d.garbageCollect(ctx)
	if err == nil || !strings.Contains(err.Error(), "Failed to garbage collect required amount of images. Attempted to free 150 bytes, but only found 30 bytes eligible to free.") {
		t.Fatalf("err %v", err)
	}
	if strings.Join(rt.removed, ",") != "sha256:spare,sha256:old,sha256:recent" {
		t.Fatalf("removed %v: the running, pending and young images must stay", rt.removed)
	}
	if ev := strings.Join(events(rec), "\n"); !strings.Contains(ev, "Warning FreeDiskSpaceFailed Failed to garbage collect") {
		t.Errorf("events %q", ev)
	}
	// Once old enough, the young image goes too; in-use ones never.
	clock.t = clock.t.Add(2 * time.Minute)
	d.garbageCollect(ctx)
	if strings.Join(rt.removed, ",") != "sha256:spare,sha256:old,sha256:recent,sha256:young" {
		t.Fatalf("removed %v", rt.removed)
	}
}
