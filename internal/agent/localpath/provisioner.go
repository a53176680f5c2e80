package localpath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// DefaultResync is the informer resync period when Provisioner.Resync is
// zero: how often claims and volumes that failed for a reason no watch
// event announces (a StorageClass created late) are looked at again.
const DefaultResync = 5 * time.Minute

const workers = 2

// Provisioner provisions and reclaims local-path volumes on one node.
type Provisioner struct {
	Client   kubernetes.Interface // credential of the user EnsureRBAC bound
	NodeName string               // the Node name; also its kubernetes.io/hostname label
	BaseDir  string               // absolute; created 0711 if missing
	Log      *slog.Logger         // nil: slog.Default()
	Resync   time.Duration        // 0: DefaultResync
}

// key is a work item: a claim (Namespace set) or a volume (Namespace empty).
type key struct {
	Namespace, Name string
}

type controller struct {
	client    kubernetes.Interface
	node      string
	baseDir   string
	log       *slog.Logger
	recorder  record.EventRecorder
	pvcLister corelisters.PersistentVolumeClaimLister
	pvLister  corelisters.PersistentVolumeLister
	queue     workqueue.TypedRateLimitingInterface[key]
}

// permanentError is a failure retrying cannot fix; the item is dropped
// (until the next resync or change) instead of being retried with backoff.
type permanentError struct{ error }

// Run serves until ctx ends, then returns nil. It returns an error at once
// when the configuration is unusable or the informers cannot sync.
func (p *Provisioner) Run(ctx context.Context) error {
	if p.Client == nil || p.NodeName == "" {
		return errors.New("localpath: Provisioner needs Client and NodeName")
	}
	if !filepath.IsAbs(p.BaseDir) {
		return fmt.Errorf("localpath: BaseDir %q is not absolute", p.BaseDir)
	}
	if err := os.MkdirAll(p.BaseDir, 0o711); err != nil {
		return fmt.Errorf("localpath: %w", err)
	}
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "local-path")
	resync := p.Resync
	if resync <= 0 {
		resync = DefaultResync
	}

	eb := record.NewBroadcaster(record.WithContext(ctx))
	eb.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.Client.CoreV1().Events("")})
	defer eb.Shutdown()
	recorder := eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ProvisionerName + "_" + p.NodeName})

	factory := informers.NewSharedInformerFactory(p.Client, resync)
	c := newController(p, log, recorder, factory)
	defer c.queue.ShutDown()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("localpath: %v informer did not sync", typ)
		}
	}
	log.Info("local-path provisioner running", "node", p.NodeName, "dir", p.BaseDir)

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func newController(p *Provisioner, log *slog.Logger, recorder record.EventRecorder, factory informers.SharedInformerFactory) *controller {
	pvcInf := factory.Core().V1().PersistentVolumeClaims()
	pvInf := factory.Core().V1().PersistentVolumes()
	c := &controller{
		client:    p.Client,
		node:      p.NodeName,
		baseDir:   filepath.Clean(p.BaseDir),
		log:       log,
		recorder:  recorder,
		pvcLister: pvcInf.Lister(),
		pvLister:  pvInf.Lister(),
		queue: workqueue.NewTypedRateLimitingQueue(
			workqueue.NewTypedItemExponentialFailureRateLimiter[key](100*time.Millisecond, 5*time.Minute)),
	}
	onClaim := func(obj any) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && c.wantsClaim(pvc) {
			c.queue.Add(key{Namespace: pvc.Namespace, Name: pvc.Name})
		}
	}
	onVolume := func(obj any) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok && c.ownsVolume(pv) && released(pv) {
			c.queue.Add(key{Name: pv.Name})
		}
	}
	// The handlers cannot fail on a factory that has not started.
	_, _ = pvcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onClaim,
		UpdateFunc: func(_, obj any) { onClaim(obj) },
	})
	_, _ = pvInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onVolume,
		UpdateFunc: func(_, obj any) { onVolume(obj) },
	})
	return c
}

func (c *controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	var err error
	if k.Namespace != "" {
		err = c.syncClaim(ctx, k.Namespace, k.Name)
	} else {
		err = c.syncVolume(ctx, k.Name)
	}
	var perm permanentError
	switch {
	case err == nil:
		c.queue.Forget(k)
	case errors.As(err, &perm):
		c.log.Warn("local-path: giving up until the object changes", "object", k.String(), "err", err)
		c.queue.Forget(k)
	case ctx.Err() != nil:
		c.queue.Forget(k)
	default:
		c.log.Warn("local-path: will retry", "object", k.String(), "err", err)
		c.queue.AddRateLimited(k)
	}
	return true
}

func (k key) String() string {
	if k.Namespace == "" {
		return "persistentvolume/" + k.Name
	}
	return "persistentvolumeclaim/" + k.Namespace + "/" + k.Name
}

// wantsClaim reports whether pvc is a claim this node should provision.
func (c *controller) wantsClaim(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.DeletionTimestamp != nil || pvc.Spec.VolumeName != "" {
		return false
	}
	prov := pvc.Annotations[annStorageProvisioner]
	if prov == "" {
		prov = pvc.Annotations[annBetaProvisioner]
	}
	return prov == ProvisionerName && pvc.Annotations[annSelectedNode] == c.node
}

// ownsVolume reports whether pv is a local-path volume on this node.
func (c *controller) ownsVolume(pv *corev1.PersistentVolume) bool {
	return pv.Annotations[annProvisionedBy] == ProvisionerName && pv.Annotations[AnnNode] == c.node
}

// released reports whether pv waits to be reclaimed by deletion.
func released(pv *corev1.PersistentVolume) bool {
	return (pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed) &&
		pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
}

// VolumeName is the name of the volume provisioned for a claim.
func VolumeName(pvc *corev1.PersistentVolumeClaim) string { return "pvc-" + string(pvc.UID) }

// dirName is the directory, under BaseDir, of the volume for pvc. Namespace
// and name are DNS labels/subdomains, so they hold no path separator.
func dirName(pvc *corev1.PersistentVolumeClaim) string {
	return VolumeName(pvc) + "_" + pvc.Namespace + "_" + pvc.Name
}

func claimClass(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Spec.StorageClassName != nil {
		return *pvc.Spec.StorageClassName
	}
	return pvc.Annotations[annBetaStorageClass]
}

func (c *controller) syncClaim(ctx context.Context, ns, name string) error {
	pvc, err := c.pvcLister.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if !c.wantsClaim(pvc) {
		return nil
	}
	pvName := VolumeName(pvc)
	if _, err := c.pvLister.Get(pvName); err == nil {
		return nil
	}
	// The cache may lag behind a volume this provisioner just created.
	if _, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); err == nil {
		return nil
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	err = c.provision(ctx, pvc, pvName)
	if err != nil && ctx.Err() == nil {
		c.recorder.Eventf(pvc, corev1.EventTypeWarning, "ProvisioningFailed",
			"failed to provision volume with StorageClass %q: %v", claimClass(pvc), err)
	}
	return err
}

func (c *controller) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pvName string) error {
	className := claimClass(pvc)
	if className == "" {
		return permanentError{errors.New("claim names no StorageClass")}
	}
	sc, err := c.client.StorageV1().StorageClasses().Get(ctx, className, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get StorageClass: %w", err)
	}
	if sc.Provisioner != ProvisionerName {
		return permanentError{fmt.Errorf("StorageClass %s has provisioner %q, not %s", className, sc.Provisioner, ProvisionerName)}
	}
	if err := checkClaim(pvc); err != nil {
		return permanentError{err}
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]

	c.recorder.Eventf(pvc, corev1.EventTypeNormal, "Provisioning",
		"External provisioner is provisioning volume for claim %q", pvc.Namespace+"/"+pvc.Name)
	dir := filepath.Join(c.baseDir, dirName(pvc))
	if err := makeDir(dir); err != nil {
		return err
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvName,
			Annotations: map[string]string{
				annProvisionedBy: ProvisionerName,
				AnnNode:          c.node,
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			PersistentVolumeReclaimPolicy: ptr.Deref(sc.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete),
			StorageClassName:              className,
			ClaimRef: &corev1.ObjectReference{
				APIVersion: "v1",
				Kind:       "PersistentVolumeClaim",
				Namespace:  pvc.Namespace,
				Name:       pvc.Name,
				UID:        pvc.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{c.node},
				}}}},
			}},
		},
	}
	_, err = c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // created by an earlier run that did not see it through
	} else if err != nil {
		return fmt.Errorf("create PersistentVolume: %w", err)
	}
	c.log.Info("provisioned volume", "pv", pvName, "claim", pvc.Namespace+"/"+pvc.Name, "dir", dir, "size", size.String())
	c.recorder.Eventf(pvc, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume %s", pvName)
	return nil
}

// checkClaim refuses what a directory cannot be.
func checkClaim(pvc *corev1.PersistentVolumeClaim) error {
	if m := pvc.Spec.VolumeMode; m != nil && *m != corev1.PersistentVolumeFilesystem {
		return fmt.Errorf("volumeMode %s is not supported by %s, which provisions directories; use volumeMode Filesystem", *m, ProvisionerName)
	}
	if pvc.Spec.Selector != nil {
		return errors.New("claim Selector is not supported")
	}
	if pvc.Spec.DataSource != nil || pvc.Spec.DataSourceRef != nil {
		return fmt.Errorf("dataSource (cloning, snapshots, populators) is not supported by %s", ProvisionerName)
	}
	if _, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		return errors.New("claim requests no storage")
	}
	return nil
}

// makeDir creates dir world-writable (like k3s's local-path provisioner, so
// pods running as any user can write), and accepts one left by an earlier
// attempt.
func makeDir(dir string) error {
	if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a directory", dir)
	}
	return os.Chmod(dir, 0o777) // past the umask
}

func (c *controller) syncVolume(ctx context.Context, name string) error {
	cached, err := c.pvLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if !c.ownsVolume(cached) || !released(cached) {
		return nil
	}
	// Decide on the live object: the directory is about to go.
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if !c.ownsVolume(pv) || !released(pv) {
		return nil
	}
	if err := c.removeDir(pv); err != nil {
		c.recorder.Eventf(pv, corev1.EventTypeWarning, "VolumeFailedDelete", "%v", err)
		return err
	}
	err = c.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: metav1.NewUIDPreconditions(string(pv.UID))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete PersistentVolume: %w", err)
	}
	c.log.Info("deleted volume", "pv", name, "dir", pv.Spec.HostPath.Path)
	return nil
}

// removeDir deletes the directory of pv, but only one directly under
// BaseDir and named for pv: whatever the volume object says, nothing else
// on the host is removed.
func (c *controller) removeDir(pv *corev1.PersistentVolume) error {
	if pv.Spec.HostPath == nil {
		return permanentError{fmt.Errorf("volume %s has no hostPath; not deleting anything", pv.Name)}
	}
	path := pv.Spec.HostPath.Path
	if err := c.checkPath(pv.Name, path); err != nil {
		return permanentError{err}
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

func (c *controller) checkPath(pvName, path string) error {
	clean := filepath.Clean(path)
	if !filepath.IsAbs(path) || filepath.Dir(clean) != c.baseDir || !strings.HasPrefix(filepath.Base(clean), pvName+"_") {
		return fmt.Errorf("refusing to delete %q for volume %s: not a directory %s_* directly under %s", path, pvName, pvName, c.baseDir)
	}
	return nil
}
