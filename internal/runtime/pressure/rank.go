package pressure

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// SystemCriticalPriority is the priority from which a pod is critical
// (scheduling.SystemCriticalPriority): the kubelet never evicts it.
const SystemCriticalPriority = 2000000000

// Container is one regular container's memory, for the eviction message.
type Container struct {
	Name         string
	RequestBytes int64
	UsageBytes   int64 // working set
	HasUsage     bool
}

// Pod is an eviction candidate.
type Pod struct {
	UID, Namespace, Name string
	Priority             int32
	// Critical: static, mirror or priority >= SystemCriticalPriority.
	Critical bool
	// RequestBytes is the pod's memory request as the scheduler counts it
	// (pod.PodTotal).
	RequestBytes int64
	// UsageBytes is the working set of all its containers; HasStats is
	// false when the runtime had no figures for the pod.
	UsageBytes int64
	HasStats   bool
	Containers []Container
}

// IsCritical is the kubelet's IsCriticalPod from what the runtime has: the
// pod's annotations (kubernetes.io/config.source other than "api" marks a
// static pod, kubernetes.io/config.mirror a mirror pod) and its priority.
func IsCritical(annotations map[string]string, priority int32) bool {
	if src, ok := annotations["kubernetes.io/config.source"]; ok && src != "api" {
		return true
	}
	if _, ok := annotations["kubernetes.io/config.mirror"]; ok {
		return true
	}
	return priority >= SystemCriticalPriority
}

// Rank orders pods as the kubelet's rankMemoryPressure does: pods without
// stats first, then those whose usage exceeds their request, then lower
// priority first, then the larger usage above the request first. The sort
// is stable: ties keep the caller's order.
func Rank(pods []Pod) {
	slices.SortStableFunc(pods, func(a, b Pod) int {
		if a.HasStats != b.HasStats {
			return cmpFirst(!a.HasStats) // no stats: evict first
		}
		if a.HasStats {
			if ea, eb := a.UsageBytes > a.RequestBytes, b.UsageBytes > b.RequestBytes; ea != eb {
				return cmpFirst(ea)
			}
		}
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		if a.HasStats {
			return cmp.Compare(b.UsageBytes-b.RequestBytes, a.UsageBytes-a.RequestBytes)
		}
		return 0
	})
}

// cmpFirst: -1 when the first of two differing flags is set, 1 otherwise.
func cmpFirst(firstSet bool) int {
	if firstSet {
		return -1
	}
	return 1
}

// Message is the kubelet's eviction message (evictionMessage): the
// threshold and what was available, then every container using more than
// its request.
func Message(obs Observation, p Pod) string {
	msg := fmt.Sprintf(messagePrefix+" Threshold quantity: %s, available: %s. ",
		quantity(obs.ThresholdBytes), quantity(int64(obs.AvailableBytes)))
	if !p.HasStats {
		return msg
	}
	for _, c := range p.Containers {
		if c.HasUsage && c.UsageBytes > c.RequestBytes {
			msg += fmt.Sprintf("Container %s was using %s, request is %s, has larger consumption of memory. ",
				c.Name, quantity(c.UsageBytes), quantity(c.RequestBytes))
		}
	}
	return msg
}

// quantity renders bytes as the kubelet's resource.Quantity (BinarySI).
func quantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// messagePrefix starts the message of an eviction for memory.
const messagePrefix = "The node was low on resource: memory."

// IsMemoryEviction reports whether a pod's status reason and message are
// those of an eviction for memory (Message's).
func IsMemoryEviction(reason, message string) bool {
	return reason == "Evicted" && strings.HasPrefix(message, messagePrefix)
}
