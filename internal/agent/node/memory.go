package node

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/k3sm-dev/k3sm/internal/diskpolicy"
	"github.com/k3sm-dev/k3sm/internal/runtime/pressure"
)

// The kubelet's node condition reasons and messages for MemoryPressure.
const (
	reasonMemoryPressure    = "KubeletHasInsufficientMemory"
	messageMemoryPressure   = "kubelet has insufficient memory available"
	reasonNoMemoryPressure  = "KubeletHasSufficientMemory"
	messageNoMemoryPressure = "kubelet has sufficient memory available"
)

// memoryWatch is the node's view of memory.available: the same signal and
// threshold the runtime daemon evicts pods on (internal/runtime/pressure),
// read on the same machine at the same housekeeping interval.
type memoryWatch struct {
	threshold pressure.Threshold
	read      func() (pressure.Memory, error)
	cond      pressureCondition
}

// watchMemory sets up the MemoryPressure condition from the --eviction-hard
// thresholds; without a memory.available one the condition stays False, as
// the kubelet's without one.
func (d *diskManager) watchMemory(ths []diskpolicy.Threshold) {
	th, ok := pressure.FromThresholds(ths)
	if !ok {
		return
	}
	d.mem = &memoryWatch{threshold: th, read: pressure.ReadMemory,
		cond: pressureCondition{typ: corev1.NodeMemoryPressure, reason: reasonMemoryPressure, message: messageMemoryPressure,
			reasonNone: reasonNoMemoryPressure, messageNone: messageNoMemoryPressure}}
}

// memoryHousekeeping measures memory.available against its threshold and
// updates MemoryPressure.
func (d *diskManager) memoryHousekeeping() {
	if d.mem == nil {
		return
	}
	obs, err := pressure.Observe(d.mem.read, d.mem.threshold)
	if err != nil {
		d.log.Warn("memory stats", "err", err)
		return
	}
	if obs.Met() {
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeWarning, "EvictionThresholdMet", "Attempting to reclaim memory")
	}
	d.setMemoryPressure(obs)
}

// setMemoryPressure updates MemoryPressure; each change is a
// NodeHasInsufficientMemory / NodeHasSufficientMemory event, as the
// kubelet records them.
func (d *diskManager) setMemoryPressure(obs pressure.Observation) {
	d.setCondition(&d.mem.cond, obs.Met(), func(p bool) {
		event := "NodeHasSufficientMemory"
		if p {
			event = "NodeHasInsufficientMemory"
			d.log.Warn("node has memory pressure", "available", obs.AvailableBytes, "threshold", obs.ThresholdBytes)
		} else {
			d.log.Info("node has no memory pressure", "available", obs.AvailableBytes, "threshold", obs.ThresholdBytes)
		}
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeNormal, event, "Node %s status is now: %s", d.nodeRef.Name, event)
	})
}

// memoryEvicted: the runtime daemon evicted a pod for memory. It checks
// memory.available apart from the node, and an eviction frees what it
// measured, so the node's own check may never see the threshold met; as
// the kubelet's single eviction manager does, the eviction itself counts
// as the threshold met now (MemoryPressure True for the transition
// period).
func (d *diskManager) memoryEvicted(pod, message string) {
	if d.mem == nil {
		return
	}
	d.setCondition(&d.mem.cond, true, func(p bool) {
		d.log.Warn("node has memory pressure: the runtime evicted a pod", "pod", pod, "message", message)
		d.recorder.Eventf(d.nodeRef, corev1.EventTypeNormal, "NodeHasInsufficientMemory", "Node %s status is now: %s", d.nodeRef.Name, "NodeHasInsufficientMemory")
	})
}
