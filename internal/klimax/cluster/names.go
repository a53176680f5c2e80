package cluster

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Label keys klimax sets on every cluster's node.
const (
	// klimax.dev/managed-by, not app.kubernetes.io/managed-by: the kubelet
	// refuses --node-labels in the kubernetes.io namespace it does not own.
	LabelManagedBy = "klimax.dev/managed-by"
	ManagedByValue = "klimax"
	LabelFleet     = "klimax.dev/fleet"
	LabelSlot      = "klimax.dev/slot"
	LabelRegion    = "topology.kubernetes.io/region"
	LabelZone      = "topology.kubernetes.io/zone"
	LabelIngress   = "ingress-ready"
	// DepLabelPrefix + <cluster> = "true" records a fleet dependsOn edge on
	// the dependent's node, so `fleet delete <name>` can order deletes
	// without the manifest.
	DepLabelPrefix = "deps.klimax.dev/"
)

// DepsFromLabels returns the dependencies recorded in node labels.
func DepsFromLabels(l map[string]string) []string {
	var out []string
	for k := range l {
		if d, ok := strings.CutPrefix(k, DepLabelPrefix); ok {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

// MaxNameLen keeps "<name>-control-plane" and "kind-<name>" well inside the
// 63-character DNS label and container name limits.
const MaxNameLen = 40

var nameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidateName checks a cluster name: an RFC 1123 label of at most 40
// characters, which makes it safe in container names, file names, URLs and any
// shell without quoting.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("cluster name is empty (use lower-case letters, digits and '-', e.g. dev)")
	}
	if len(name) > MaxNameLen || !nameRe.MatchString(name) {
		return fmt.Errorf("invalid cluster name %q: use 1-%d lower-case letters, digits and '-', starting and ending with a letter or digit (e.g. dev, team-a)", name, MaxNameLen)
	}
	return nil
}

// ContextName is the kubeconfig context/cluster/user name kind uses.
func ContextName(name string) string { return "kind-" + name }

// NodeName is the control-plane node container of a kind cluster.
func NodeName(name string) string { return name + "-control-plane" }

// ParseLabels parses k=v pairs (as given to -l) into a map, validating keys
// and values as Kubernetes labels. Keys ending in '-' are removals.
func ParseLabels(args []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	for _, a := range args {
		for _, kv := range strings.Split(a, ",") {
			kv = strings.TrimSpace(kv)
			if kv == "" {
				continue
			}
			if k, ok := strings.CutSuffix(kv, "-"); ok && !strings.Contains(kv, "=") {
				if errs := validation.IsQualifiedName(k); len(errs) > 0 {
					return nil, nil, fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
				}
				remove = append(remove, k)
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, nil, fmt.Errorf("label %q: use key=value to set or key- to remove", kv)
			}
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return nil, nil, fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				return nil, nil, fmt.Errorf("label %q value %q: %s", k, v, strings.Join(errs, "; "))
			}
			set[k] = v
		}
	}
	sort.Strings(remove)
	return set, remove, nil
}

// Reserved reports label keys users may not set directly with -l because
// klimax manages them (fleet membership has its own commands).
func Reserved(key string) bool {
	switch key {
	case LabelManagedBy, LabelSlot, LabelFleet:
		return true
	}
	return strings.HasPrefix(key, DepLabelPrefix)
}
