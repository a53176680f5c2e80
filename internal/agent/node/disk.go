package node

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
)

// The kubelet's node condition reasons and messages for DiskPressure.
const (
	reasonDiskPressure    = "KubeletHasDiskPressure"
	messageDiskPressure   = "kubelet has disk pressure"
	reasonNoDiskPressure  = "KubeletHasNoDiskPressure"
	messageNoDiskPressure = "kubelet has no disk pressure"
)

// fsStats is one filesystem's capacity and what is free.
type fsStats struct {
	CapacityBytes, AvailableBytes uint64
	Inodes, InodesFree            uint64
}

func statfs(path string) (fsStats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsStats{}, err
	}
	return fsStats{CapacityBytes: uint64(st.Blocks) * uint64(st.Bsize), AvailableBytes: uint64(st.Bavail) * uint64(st.Bsize),
		Inodes: uint64(st.Files), InodesFree: uint64(st.Ffree)}, nil
}

// diskRuntime is what the disk manager asks the runtime daemon.
type diskRuntime interface {
	ListPods(ctx context.Context, req *runtimev1.ListPodsRequest) (*runtimev1.ListPodsResponse, error)
	ListImages(ctx context.Context) ([]*runtimev1.Image, error)
	RemoveImage(ctx context.Context, id string) error
}

// grpcDiskRuntime adapts the runtime client.
type grpcDiskRuntime struct {
	rt runtimev1.RuntimeClient
	im runtimev1.ImagesClient
}

func (g grpcDiskRuntime) ListPods(ctx context.Context, req *runtimev1.ListPodsRequest) (*runtimev1.ListPodsResponse, error) {
	return g.rt.ListPods(ctx, req)
}
func (g grpcDiskRuntime) ListImages(ctx context.Context) ([]*runtimev1.Image, error) {
	resp, err := g.im.ListImages(ctx, &runtimev1.ListImagesRequest{})
	return resp.GetImages(), err
}
func (g grpcDiskRuntime) RemoveImage(ctx context.Context, id string) error {
	_, err := g.im.RemoveImage(ctx, &runtimev1.RemoveImageRequest{Image: id})
	return err
}

// imageRecord is what the kubelet's image GC manager keeps per image.
type imageRecord struct {
	firstDetected time.Time
	lastUsed      time.Time
	size          int64
	name          string
}

// diskManager does the kubelet's disk housekeeping for the node: the
// DiskPressure condition from the data dir's filesystem (nodefs) and the
// image store's (imagefs) against the hard eviction thresholds, and image
// garbage collection (the kubelet's realImageGCManager: records of when each
// image was first seen and last used by a pod, least recently used removed
// first, none younger than the minimum age, none a pod still uses).
type diskManager struct {
	cfg        diskpolicy.Config
	thresholds []diskpolicy.Threshold
	nodefs     string // the data dir
	imagefs    string // the image store
	rt         diskRuntime
	recorder   record.EventRecorder
	nodeRef    *corev1.ObjectReference
	log        *slog.Logger
	statfs     func(string) (fsStats, error)
	now        func() time.Time

	mu      sync.Mutex
	records map[string]*imageRecord // by image id
	notify  func(*corev1.Node)
	node    *corev1.Node      // the provider's view of the node, DiskPressure kept current
	disk    pressureCondition // DiskPressure
	mem     *memoryWatch      // MemoryPressure (memory.go); nil: not watched
}

func newDiskManager(cfg diskpolicy.Config, dataDir, nodeName string, rt diskRuntime, recorder record.EventRecorder, log *slog.Logger) (*diskManager, error) {
	th, err := diskpolicy.ParseEvictionHard(cfg.EvictionHard)
	if err != nil {
		return nil, fmt.Errorf("--eviction-hard: %w", err)
	}
	if cfg.HousekeepingInterval <= 0 {
		cfg.HousekeepingInterval = 10 * time.Second
	}
	if cfg.ImageGCPeriod <= 0 {
		cfg.ImageGCPeriod = 5 * time.Minute
	}
	d := &diskManager{cfg: cfg, thresholds: th, nodefs: dataDir, imagefs: datadir.New(dataDir).ImagesDir(), rt: rt,
		recorder: recorder, log: log, statfs: statfs, now: time.Now, records: map[string]*imageRecord{},
		disk: pressureCondition{typ: corev1.NodeDiskPressure, reason: reasonDiskPressure, message: messageDiskPressure,
			reasonNone: reasonNoDiskPressure, messageNone: messageNoDiskPressure},
		// As the kubelet names its node in events.
		nodeRef: &corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)}}
	d.watchMemory(th)
	return d, nil
}

// setNode gives the manager the node object whose DiskPressure condition it
// keeps, and the callback (Virtual Kubelet's NotifyNodeStatus) it reports a
// change through.
func (d *diskManager) setNode(n *corev1.Node, notify func(*corev1.Node)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.node, d.notify = n.DeepCopy(), notify
}

// run measures the disk every HousekeepingInterval and collects images
// every ImageGCPeriod until ctx ends.
func (d *diskManager) run(ctx context.Context) {
	house := time.NewTicker(d.cfg.HousekeepingInterval)
	defer house.Stop()
	gc := time.NewTicker(d.cfg.ImageGCPeriod)
	defer gc.Stop()
	// Images are detected (first seen, last used) once per GC period, as
	// the kubelet's image manager does, not at every housekeeping: that
	// would list every pod and image each 10 s on an idle node.
	d.detect(ctx)
	d.housekeeping(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-house.C:
			d.housekeeping(ctx)
		case <-gc.C:
			d.detect(ctx)
			if err := d.garbageCollect(ctx); err != nil {
				d.log.Warn("image garbage collection failed", "err", err)
			}
		}
	}
}

func (d *diskManager) detect(ctx context.Context) {
	if _, err := d.detectImages(ctx); err != nil {
		d.log.Debug("detect images", "err", err)
	}
}

// housekeeping evaluates the thresholds; under pressure it reclaims unused
// images first (freeSpace detects them anew), as the kubelet's eviction
// manager does.
func (d *diskManager) housekeeping(ctx context.Context) {
	d.memoryHousekeeping()
	crossed, err := d.observe()
	if err != nil {
		d.log.Warn("disk stats", "err", err)
		return
	}
	if len(crossed) > 0 {
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeWarning, "EvictionThresholdMet", "Attempting to reclaim ephemeral-storage")
		d.log.Warn("disk eviction threshold met", "signals", crossed)
		if freed, err := d.freeSpace(ctx, math.MaxInt64); err != nil {
			d.log.Warn("reclaim images under disk pressure", "err", err)
		} else if freed > 0 {
			if crossed, err = d.observe(); err != nil {
				return
			}
		}
	}
	d.setPressure(len(crossed) > 0)
}

// observe returns the hard eviction thresholds now crossed.
func (d *diskManager) observe() ([]string, error) {
	nodefs, err := d.statfs(d.nodefs)
	if err != nil {
		return nil, err
	}
	imagefs, err := d.statfs(d.imagefs)
	if err != nil {
		imagefs = nodefs // no store yet: the same filesystem
	}
	var crossed []string
	for _, t := range d.thresholds {
		var avail, capacity uint64
		switch t.Signal {
		case diskpolicy.MemoryAvailable:
			continue // MemoryPressure: memory.go
		case "nodefs.available":
			avail, capacity = nodefs.AvailableBytes, nodefs.CapacityBytes
		case "nodefs.inodesFree":
			avail, capacity = nodefs.InodesFree, nodefs.Inodes
		case "imagefs.available":
			avail, capacity = imagefs.AvailableBytes, imagefs.CapacityBytes
		case "imagefs.inodesFree":
			avail, capacity = imagefs.InodesFree, imagefs.Inodes
		}
		if capacity == 0 {
			continue // e.g. a filesystem without inode accounting
		}
		limit := float64(t.Value)
		if t.Percent > 0 {
			limit = float64(capacity) * t.Percent / 100
		}
		if float64(avail) < limit {
			crossed = append(crossed, fmt.Sprintf("%s=%d<%.0f", t.Signal, avail, limit))
		}
	}
	return crossed, nil
}

// setPressure updates the DiskPressure condition.
func (d *diskManager) setPressure(observed bool) {
	d.setCondition(&d.disk, observed, func(pressure bool) {
		if pressure {
			d.log.Warn("node has disk pressure")
		} else {
			d.log.Info("node has no disk pressure")
		}
	})
}

// pressureCondition is a node pressure condition (DiskPressure,
// MemoryPressure) with the kubelet's reasons and messages, and its state.
type pressureCondition struct {
	typ                     corev1.NodeConditionType
	reason, message         string // True
	reasonNone, messageNone string // False
	pressure                bool
	lastSeen                time.Time // last time a threshold was met
}

// setCondition records whether c's threshold is met: c is True while it is
// and for EvictionPressureTransitionPeriod after (the kubelet's
// evictionPressureTransitionPeriod), then False. A change of the node's
// condition calls changed, then reports the node.
func (d *diskManager) setCondition(c *pressureCondition, met bool, changed func(pressure bool)) {
	d.mu.Lock()
	now := d.now()
	if met {
		c.lastSeen = now
	}
	pressure := met || (!c.lastSeen.IsZero() && now.Sub(c.lastSeen) < d.cfg.EvictionPressureTransitionPeriod)
	if pressure == c.pressure || d.node == nil {
		c.pressure = pressure
		d.mu.Unlock()
		return
	}
	c.pressure = pressure
	c.set(d.node, pressure, metav1.NewTime(now))
	n, notify := d.node.DeepCopy(), d.notify
	d.mu.Unlock()
	changed(pressure)
	if notify != nil {
		notify(n)
	}
}

// set sets n's condition as the kubelet does.
func (c *pressureCondition) set(n *corev1.Node, pressure bool, now metav1.Time) {
	nc := corev1.NodeCondition{Type: c.typ, Status: corev1.ConditionFalse, Reason: c.reasonNone,
		Message: c.messageNone, LastHeartbeatTime: now, LastTransitionTime: now}
	if pressure {
		nc.Status, nc.Reason, nc.Message = corev1.ConditionTrue, c.reason, c.message
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == c.typ {
			if n.Status.Conditions[i].Status == nc.Status {
				nc.LastTransitionTime = n.Status.Conditions[i].LastTransitionTime
			}
			n.Status.Conditions[i] = nc
			return
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, nc)
}

// detectImages refreshes the records: new images get firstDetected now,
// images a pod uses (running or not, as long as the runtime has it) get
// lastUsed now, vanished images are forgotten. It returns the ids in use.
func (d *diskManager) detectImages(ctx context.Context) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	imgs, err := d.rt.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	pods, err := d.rt.ListPods(ctx, &runtimev1.ListPodsRequest{})
	if err != nil {
		return nil, err
	}
	inUse := imagesInUse(imgs, pods)
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	seen := map[string]bool{}
	for _, img := range imgs {
		id := img.GetId()
		seen[id] = true
		r := d.records[id]
		if r == nil {
			r = &imageRecord{firstDetected: now}
			d.records[id] = r
		}
		r.size = img.GetSizeBytes()
		r.name = id
		if len(img.GetRepoTags()) > 0 {
			r.name = img.GetRepoTags()[0]
		}
		if inUse[id] {
			r.lastUsed = now
		}
	}
	for id := range d.records {
		if !seen[id] {
			delete(d.records, id)
		}
	}
	return inUse, nil
}

// imagesInUse: the ids of images a pod the runtime knows refers to, by
// the image its containers run (image_digest) or by the reference in its
// spec (a container not started yet).
func imagesInUse(imgs []*runtimev1.Image, pods *runtimev1.ListPodsResponse) map[string]bool {
	byRef := map[string]string{}
	for _, img := range imgs {
		for _, r := range append(append([]string(nil), img.GetRepoTags()...), img.GetRepoDigests()...) {
			byRef[r] = img.GetId()
		}
	}
	inUse := map[string]bool{}
	for _, st := range pods.GetPods() {
		for _, cs := range append(append([]*runtimev1.ContainerStatus(nil), st.GetInitContainerStatuses()...), st.GetContainerStatuses()...) {
			if cs.GetImageDigest() != "" {
				inUse[cs.GetImageDigest()] = true
			}
		}
	}
	for _, spec := range pods.GetSpecs() {
		for _, c := range append(append([]*runtimev1.ContainerSpec(nil), spec.GetInitContainers()...), spec.GetContainers()...) {
			ref := c.GetImage()
			if id, ok := byRef[ref]; ok {
				inUse[id] = true
			} else if r, err := name.ParseReference(ref); err == nil {
				if id, ok := byRef[r.Name()]; ok {
					inUse[id] = true
				}
			}
		}
	}
	return inUse
}

// garbageCollect is the kubelet's image GC: above the high threshold of the
// image filesystem, free down to the low threshold.
func (d *diskManager) garbageCollect(ctx context.Context) error {
	fs, err := d.statfs(d.imagefs)
	if err != nil {
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeWarning, "ImageGCFailed", "failed to get imageFs info: %v", err)
		return err
	}
	if fs.CapacityBytes == 0 || fs.AvailableBytes > fs.CapacityBytes {
		return nil
	}
	usage := fs.CapacityBytes - fs.AvailableBytes
	percent := int(usage * 100 / fs.CapacityBytes)
	if percent < d.cfg.ImageGCHighThresholdPercent {
		return nil
	}
	amountToFree := int64(fs.CapacityBytes)*int64(100-d.cfg.ImageGCLowThresholdPercent)/100 - int64(fs.AvailableBytes)
	d.log.Info("image filesystem usage over the high threshold, freeing", "usage", percent, "highThreshold", d.cfg.ImageGCHighThresholdPercent,
		"amountToFree", amountToFree, "lowThreshold", d.cfg.ImageGCLowThresholdPercent)
	freed, err := d.freeSpace(ctx, amountToFree)
	if err != nil {
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeWarning, "ImageGCFailed", "%v", err)
		return err
	}
	if freed < amountToFree {
		err := fmt.Errorf("Failed to garbage collect required amount of images. Attempted to free %d bytes, but only found %d bytes eligible to free.", amountToFree, freed)
		d.recorder.Event(d.nodeRef, corev1.EventTypeWarning, "FreeDiskSpaceFailed", err.Error())
		return err
	}
	return nil
}

// freeSpace removes unused images, least recently used first, none younger
// than ImageMinimumGCAge, until bytesToFree bytes are freed.
func (d *diskManager) freeSpace(ctx context.Context, bytesToFree int64) (int64, error) {
	inUse, err := d.detectImages(ctx)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	now := d.now()
	type cand struct {
		id string
		r  imageRecord
	}
	var cands []cand
	for id, r := range d.records {
		if !inUse[id] {
			cands = append(cands, cand{id, *r})
		}
	}
	d.mu.Unlock()
	sort.Slice(cands, func(i, j int) bool {
		if !cands[i].r.lastUsed.Equal(cands[j].r.lastUsed) {
			return cands[i].r.lastUsed.Before(cands[j].r.lastUsed)
		}
		return cands[i].r.firstDetected.Before(cands[j].r.firstDetected)
	})
	var freed int64
	for _, c := range cands {
		if freed >= bytesToFree {
			break
		}
		if now.Sub(c.r.firstDetected) < d.cfg.ImageMinimumGCAge {
			continue
		}
		d.log.Info("removing image to free bytes", "image", c.r.name, "imageID", c.id, "size", c.r.size, "lastUsed", c.r.lastUsed)
		if err := d.rt.RemoveImage(ctx, c.id); err != nil {
			d.log.Warn("remove image", "image", c.r.name, "imageID", c.id, "err", err)
			continue
		}
		d.mu.Lock()
		delete(d.records, c.id)
		d.mu.Unlock()
		freed += c.r.size
	}
	return freed, nil
}
