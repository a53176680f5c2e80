package node

import (
	"context"
	"crypto/sha256"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// VolumeRefreshPeriod is how often the node re-reads what its pods' files
// volumes (configMap, secret, downwardAPI, projected) show, so that updates
// reach running pods. The kubelet's sync period is a minute; k3sm is quicker
// because one round costs one GET per distinct object, not per pod.
const VolumeRefreshPeriod = 10 * time.Second

// refreshVolumes rewrites changed files volumes every period, atomically
// through the runtime; nothing is restarted.
func (p *Provider) refreshVolumes(ctx context.Context, period time.Duration) {
	wait.UntilWithContext(ctx, p.refreshRound, period)
}

// refreshRound refreshes every running pod's files volumes once, reading each
// referenced object once.
func (p *Provider) refreshRound(ctx context.Context) {
	p.mu.Lock()
	var pods []*corev1.Pod
	for _, st := range p.pods {
		if pod := st.pod; pod != nil && st.known && !st.gone && pod.DeletionTimestamp == nil && podspec.HasFilesVolumes(pod) {
			pods = append(pods, pod.DeepCopy())
		}
	}
	p.mu.Unlock()
	round := p.translator.NewVolumeRefresh()
	for _, pod := range pods {
		if ctx.Err() != nil {
			return
		}
		p.refreshPod(ctx, round, pod)
	}
}

// refreshPod sends a pod's files volumes to the runtime when they differ from
// what was sent last.
func (p *Provider) refreshPod(ctx context.Context, round *podspec.VolumeRefresh, pod *corev1.Pod) {
	vols, err := round.FilesVolumes(ctx, pod)
	if err != nil {
		// The pod keeps what it has, as with the kubelet.
		p.log.Debug("refreshing volumes", "pod", key(pod.Namespace, pod.Name), "err", err)
		return
	}
	p.sendVolumes(ctx, pod, vols)
}

// sendVolumes passes a pod's files volumes to the runtime unless they are
// what was sent last.
func (p *Provider) sendVolumes(ctx context.Context, pod *corev1.Pod, vols []*runtimev1.Volume) {
	vols = filesVolumes(vols)
	h := volumesHash(vols)
	p.mu.Lock()
	var last [32]byte
	if st := p.pods[pod.UID]; st != nil {
		last = st.volumesHash
	}
	p.mu.Unlock()
	if last == h {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.rt.Runtime.UpdatePodVolumes(cctx, &runtimev1.UpdatePodVolumesRequest{Uid: string(pod.UID), Volumes: vols}); err != nil {
		p.log.Warn("updating volumes", "pod", key(pod.Namespace, pod.Name), "err", err)
		return
	}
	p.mu.Lock()
	if st := p.pods[pod.UID]; st != nil && st.known {
		st.volumesHash = h
	}
	p.mu.Unlock()
}

// sentVolumes records the files volumes sent with a pod's spec.
func (p *Provider) sentVolumes(uid types.UID, vols []*runtimev1.Volume) {
	h := volumesHash(filesVolumes(vols))
	p.mu.Lock()
	p.state(uid).volumesHash = h
	p.mu.Unlock()
}

// filesVolumes keeps the volumes whose content the node refreshes.
func filesVolumes(vols []*runtimev1.Volume) []*runtimev1.Volume {
	var files []*runtimev1.Volume
	for _, v := range vols {
		if v.GetFiles() != nil {
			files = append(files, v)
		}
	}
	return files
}

func volumesHash(vols []*runtimev1.Volume) [32]byte {
	h := sha256.New()
	for _, v := range vols {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(v)
		h.Write(b)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
