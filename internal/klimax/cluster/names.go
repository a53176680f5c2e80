package cluster

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	kubeletapis "k8s.io/kubelet/pkg/apis"
)

// Label keys klimax sets on every cluster's node. kind passes node labels to
// the kubelet as --node-labels, and the kubelet refuses keys under
// kubernetes.io / k8s.io outside its allowed set, so klimax's own keys live
// under klimax.dev (app.kubernetes.io/managed-by made every real create fail).
// Docker container labels are not restricted: docker.LabelManagedBy is a
// different, Docker-level label.
const (
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

// ValidateName checks a cluster name: an RFC 1123 label of at most 40
// characters, which makes it safe in container names, file names, URLs and any
// shell without quoting. It is klimax's one check of cluster names.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("cluster name is empty (use lower-case letters, digits and '-', e.g. dev)")
	}
	if len(name) > MaxNameLen || len(validation.IsDNS1123Label(name)) > 0 {
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

// IsKubernetesLabel reports keys in the kubernetes.io or k8s.io namespaces
// (or their subdomains), the ones the kubelet restricts. It is the kubelet's
// own rule (k8s.io/kubernetes/cmd/kubelet/app/options, unexported there);
// the allowed set comes from k8s.io/kubelet/pkg/apis.
func IsKubernetesLabel(key string) bool {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	return ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") ||
		ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
}

// ValidateNodeLabel checks one node label the way the kubelet checks
// --node-labels (kind passes node labels that way): key and value syntax,
// and no kubernetes.io / k8s.io key outside the kubelet's allowed set. field
// names where the label came from (e.g. "-l", "--region",
// "spec.clusters[0].labels"); the error names it and the fix.
func ValidateNodeLabel(field, key, value string) error {
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return fmt.Errorf("%s: label key %q: %s (fix: use name or prefix/name, e.g. team or example.com/team)", field, key, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return fmt.Errorf("%s: label %s value %q: %s (fix: use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)", field, key, value, strings.Join(errs, "; "))
	}
	if IsKubernetesLabel(key) && !kubeletapis.IsKubeletLabel(key) {
		return fmt.Errorf("%s: label key %q is in the kubernetes.io/k8s.io namespace, which the kubelet refuses in --node-labels (only %s, or the prefixes %s) and the cluster would never start (fix: use a key of your own domain, e.g. example.com/%s)",
			field, key, strings.Join(kubeletapis.KubeletLabels(), ", "), strings.Join(kubeletapis.KubeletLabelNamespaces(), ", "), key[strings.Index(key, "/")+1:])
	}
	return nil
}

// ValidateNodeLabels checks a set of labels (sorted, first problem each)
// and returns every problem at once.
func ValidateNodeLabels(field string, l map[string]string) error {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []string
	for _, k := range keys {
		if err := ValidateNodeLabel(field, k, l[k]); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
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
