package localpath

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

const testNode = "n1"

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func class(policy corev1.PersistentVolumeReclaimPolicy) *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: StorageClassName},
		Provisioner:       ProvisionerName,
		ReclaimPolicy:     ptr.To(policy),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
}

func claim(name, node, provisioner string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{annStorageProvisioner: provisioner, annSelectedNode: node},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(StorageClassName),
			VolumeMode:       ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi"),
			}},
		},
	}
}

// releasedVolume is a volume this provisioner made on node, now Released.
func releasedVolume(name, node, path string, policy corev1.PersistentVolumeReclaimPolicy) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("pv-uid-" + name),
			Annotations: map[string]string{annProvisionedBy: ProvisionerName, AnnNode: node},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			StorageClassName:              StorageClassName,
			ClaimRef:                      &corev1.ObjectReference{Namespace: "ns", Name: "gone", UID: "uid-gone"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
			},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
}

// run starts a Provisioner for testNode and stops it when the test ends.
func run(t *testing.T, client kubernetes.Interface, base string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	p := &Provisioner{Client: client, NodeName: testNode, BaseDir: base, Log: testLog(t), Resync: time.Second}
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// started builds a controller whose caches are synced but whose queue no
// worker drains, so tests can call its sync functions one at a time.
func started(t *testing.T, client kubernetes.Interface, base string) (*controller, *record.FakeRecorder) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(client, 0)
	rec := record.NewFakeRecorder(100)
	c := newController(&Provisioner{Client: client, NodeName: testNode, BaseDir: base}, testLog(t), rec, factory)
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		c.queue.ShutDown()
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}
	return c, rec
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func findEvent(client kubernetes.Interface, ns, reason string) *corev1.Event {
	list, err := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	for i := range list.Items {
		if list.Items[i].Reason == reason {
			return &list.Items[i]
		}
	}
	return nil
}

func TestProvision(t *testing.T) {
	base := t.TempDir()
	pvc := claim("data", testNode, ProvisionerName)
	pvc.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	client := fake.NewClientset(class(corev1.PersistentVolumeReclaimDelete), pvc)
	run(t, client, base)

	var pv *corev1.PersistentVolume
	poll.Until(t, 15*time.Second, "the volume", func() bool {
		var err error
		pv, err = client.CoreV1().PersistentVolumes().Get(context.Background(), "pvc-uid-data", metav1.GetOptions{})
		return err == nil
	})
	dir := filepath.Join(base, "pvc-uid-data_ns_data")
	want := corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
		VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		StorageClassName:              StorageClassName,
		ClaimRef: &corev1.ObjectReference{
			APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "data", UID: "uid-data",
		},
		PersistentVolumeSource: corev1.PersistentVolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
		},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{testNode},
			}}}},
		}},
	}
	if !reflect.DeepEqual(pv.Spec, want) {
		t.Errorf("PV spec:\n got %+v\nwant %+v", pv.Spec, want)
	}
	if got := pv.Annotations; got[annProvisionedBy] != ProvisionerName || got[AnnNode] != testNode {
		t.Errorf("PV annotations = %v", got)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("%s: mode %v, want a 0777 directory", dir, fi.Mode())
	}
	for _, reason := range []string{"Provisioning", "ProvisioningSucceeded"} {
		poll.Until(t, 15*time.Second, reason+" event", func() bool {
			ev := findEvent(client, "ns", reason)
			return ev != nil && ev.Type == corev1.EventTypeNormal && ev.InvolvedObject.Name == "data" &&
				ev.Source.Component == ProvisionerName+"_"+testNode
		})
	}
}

func TestProvisionTakesPolicyFromClassAndBetaAnnotation(t *testing.T) {
	base := t.TempDir()
	pvc := claim("old", testNode, "")
	delete(pvc.Annotations, annStorageProvisioner)
	pvc.Annotations[annBetaProvisioner] = ProvisionerName
	pvc.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	client := fake.NewClientset(class(corev1.PersistentVolumeReclaimRetain), pvc)
	c, rec := started(t, client, base)
	if err := c.syncClaim(context.Background(), "ns", "old"); err != nil {
		t.Fatal(err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pvc-uid-old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("reclaim policy = %s, want the class's Retain", pv.Spec.PersistentVolumeReclaimPolicy)
	}
	if !reflect.DeepEqual(pv.Spec.AccessModes, pvc.Spec.AccessModes) {
		t.Errorf("access modes = %v", pv.Spec.AccessModes)
	}
	if got := drain(rec); !strings.Contains(got, "ProvisioningSucceeded") {
		t.Errorf("events = %q", got)
	}
}

func drain(rec *record.FakeRecorder) string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func TestIgnoresClaimsNotForThisNode(t *testing.T) {
	base := t.TempDir()
	other := claim("other-node", "n2", ProvisionerName)
	foreign := claim("other-provisioner", testNode, "example.com/nfs")
	unscheduled := claim("unscheduled", "", ProvisionerName)
	bound := claim("bound", testNode, ProvisionerName)
	bound.Spec.VolumeName = "pv-elsewhere"
	deleting := claim("deleting", testNode, ProvisionerName)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Finalizers = []string{"kubernetes.io/pvc-protection"}
	claims := []*corev1.PersistentVolumeClaim{other, foreign, unscheduled, bound, deleting}

	client := fake.NewClientset(class(corev1.PersistentVolumeReclaimDelete), other, foreign, unscheduled, bound, deleting)
	c, rec := started(t, client, base)
	for _, pvc := range claims {
		if c.wantsClaim(pvc) {
			t.Errorf("%s: wanted", pvc.Name)
		}
		if err := c.syncClaim(context.Background(), pvc.Namespace, pvc.Name); err != nil {
			t.Errorf("%s: %v", pvc.Name, err)
		}
	}
	pvs, _ := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if len(pvs.Items) != 0 {
		t.Errorf("volumes created: %v", pvs.Items)
	}
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Errorf("directories created: %v", ents)
	}
	if got := drain(rec); got != "" {
		t.Errorf("events: %q", got)
	}
	if n := c.queue.Len(); n != 0 {
		t.Errorf("%d ignored claims were queued", n)
	}
}

func TestProvisionRestartSafe(t *testing.T) {
	base := t.TempDir()
	pvc := claim("again", testNode, ProvisionerName)
	// A crash after mkdir: the directory (with data) is there, the PV not.
	dir := filepath.Join(base, "pvc-uid-again_ns_again")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(class(corev1.PersistentVolumeReclaimDelete), pvc)
	c, _ := started(t, client, base)
	ctx := context.Background()
	if err := c.syncClaim(ctx, "ns", "again"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumes().Get(ctx, "pvc-uid-again", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(dir, "f")) {
		t.Error("data in the existing directory was lost")
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("directory not made 0777: %v %v", fi.Mode(), err)
	}
	// A crash after the create: the PV exists; provisioning again is a no-op.
	if err := c.provision(ctx, pvc, "pvc-uid-again"); err != nil {
		t.Errorf("provision with the volume already there: %v", err)
	}
	if err := c.syncClaim(ctx, "ns", "again"); err != nil {
		t.Errorf("sync with the volume already there: %v", err)
	}
}

func TestBlockModeFails(t *testing.T) {
	base := t.TempDir()
	pvc := claim("raw", testNode, ProvisionerName)
	pvc.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	client := fake.NewClientset(class(corev1.PersistentVolumeReclaimDelete), pvc)
	run(t, client, base)
	var ev *corev1.Event
	poll.Until(t, 15*time.Second, "ProvisioningFailed event", func() bool {
		ev = findEvent(client, "ns", "ProvisioningFailed")
		return ev != nil
	})
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Name != "raw" || !strings.Contains(ev.Message, "use volumeMode Filesystem") {
		t.Errorf("event = %s %s %q", ev.Type, ev.InvolvedObject.Name, ev.Message)
	}
	if _, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pvc-uid-raw", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("volume created for a Block claim (err %v)", err)
	}
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Errorf("directories created: %v", ents)
	}
}

func TestReclaimDelete(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "pvc-uid-gone_ns_gone")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	failed := filepath.Join(base, "pvc-uid-failed_ns_failed")
	if err := os.Mkdir(failed, 0o777); err != nil {
		t.Fatal(err)
	}
	pvFailed := releasedVolume("pvc-uid-failed", testNode, failed, corev1.PersistentVolumeReclaimDelete)
	pvFailed.Status.Phase = corev1.VolumeFailed
	client := fake.NewClientset(releasedVolume("pvc-uid-gone", testNode, dir, corev1.PersistentVolumeReclaimDelete), pvFailed)
	run(t, client, base)
	for _, name := range []string{"pvc-uid-gone", "pvc-uid-failed"} {
		poll.Until(t, 15*time.Second, name+" deleted", func() bool {
			_, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
	for _, d := range []string{dir, failed} {
		if exists(d) {
			t.Errorf("%s still exists", d)
		}
	}
	if !exists(base) {
		t.Error("BaseDir removed")
	}
}

func TestReclaimLeavesRetainBoundAndOtherNodes(t *testing.T) {
	base := t.TempDir()
	mk := func(name string) string {
		d := filepath.Join(base, name+"_ns_x")
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		return d
	}
	retain := releasedVolume("pvc-retain", testNode, mk("pvc-retain"), corev1.PersistentVolumeReclaimRetain)
	bound := releasedVolume("pvc-bound", testNode, mk("pvc-bound"), corev1.PersistentVolumeReclaimDelete)
	bound.Status.Phase = corev1.VolumeBound
	elsewhere := releasedVolume("pvc-elsewhere", "n2", mk("pvc-elsewhere"), corev1.PersistentVolumeReclaimDelete)
	foreign := releasedVolume("pvc-foreign", testNode, mk("pvc-foreign"), corev1.PersistentVolumeReclaimDelete)
	foreign.Annotations[annProvisionedBy] = "example.com/other"
	vols := []*corev1.PersistentVolume{retain, bound, elsewhere, foreign}

	client := fake.NewClientset(retain, bound, elsewhere, foreign)
	c, rec := started(t, client, base)
	for _, pv := range vols {
		if err := c.syncVolume(context.Background(), pv.Name); err != nil {
			t.Errorf("%s: %v", pv.Name, err)
		}
		if _, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: %v", pv.Name, err)
		}
		if !exists(pv.Spec.HostPath.Path) {
			t.Errorf("%s: directory removed", pv.Name)
		}
	}
	if got := drain(rec); got != "" {
		t.Errorf("events: %q", got)
	}
}

func TestReclaimRefusesPathsOutsideBaseDir(t *testing.T) {
	base := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "pvc-x_ns_x")
	nested := filepath.Join(base, "sub", "pvc-x_ns_x")
	otherVol := filepath.Join(base, "pvc-y_ns_y")
	for _, d := range []string{victim, nested, otherVol} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{
		victim,
		filepath.Join(base, "..", filepath.Base(outside), "pvc-x_ns_x"),
		nested,
		otherVol, // under BaseDir but not this volume's
		base,
		"relative/pvc-x_ns_x",
		"/",
	} {
		t.Run(path, func(t *testing.T) {
			client := fake.NewClientset(releasedVolume("pvc-x", testNode, path, corev1.PersistentVolumeReclaimDelete))
			c, rec := started(t, client, base)
			err := c.syncVolume(context.Background(), "pvc-x")
			var perm permanentError
			if !errors.As(err, &perm) || !strings.Contains(err.Error(), "refusing") {
				t.Errorf("syncVolume = %v, want a permanent refusal", err)
			}
			if _, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pvc-x", metav1.GetOptions{}); err != nil {
				t.Errorf("volume deleted: %v", err)
			}
			if got := drain(rec); !strings.Contains(got, "Warning VolumeFailedDelete") {
				t.Errorf("events = %q", got)
			}
		})
	}
	for _, d := range []string{victim, nested, otherVol, base} {
		if !exists(d) {
			t.Errorf("%s was removed", d)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	client := fake.NewClientset()
	for _, p := range []*Provisioner{
		{NodeName: testNode, BaseDir: t.TempDir()},
		{Client: client, BaseDir: t.TempDir()},
		{Client: client, NodeName: testNode, BaseDir: "relative"},
	} {
		if err := p.Run(context.Background()); err == nil {
			t.Errorf("Run(%+v) accepted", *p)
		}
	}
}
