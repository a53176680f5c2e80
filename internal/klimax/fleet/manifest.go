// Package fleet owns klimax Fleet manifests (apiVersion klimax.dev/v1alpha1,
// kind Fleet): strict parsing and validation, planning (slots assigned before
// any create, membership, adoption), and the dependency-ordered parallel
// scheduler used to create and delete the member clusters.
package fleet

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/k3sm-dev/k3sm/internal/klimax/cluster"
	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

// Manifest identity.
const (
	APIVersion = "klimax.dev/v1alpha1"
	Kind       = "Fleet"
)

// Strategies on failure.
const (
	FailFast        = "FailFast"
	ContinueOnError = "ContinueOnError"
)

// Fleet is the manifest.
type Fleet struct {
	APIVersion string   `yaml:"apiVersion" json:"apiVersion"`
	Kind       string   `yaml:"kind" json:"kind"`
	Metadata   Metadata `yaml:"metadata" json:"metadata"`
	Spec       Spec     `yaml:"spec" json:"spec"`
}

// Metadata names the fleet.
type Metadata struct {
	Name string `yaml:"name" json:"name"`
}

// Spec is the fleet body.
type Spec struct {
	MaxParallel int            `yaml:"maxParallel" json:"maxParallel"`
	Strategy    string         `yaml:"strategy" json:"strategy"`
	Defaults    Defaults       `yaml:"defaults" json:"defaults"`
	Clusters    []ClusterEntry `yaml:"clusters" json:"clusters"`
}

// Defaults apply to every cluster that does not set the field itself.
type Defaults struct {
	NodeVersion string            `yaml:"nodeVersion" json:"nodeVersion,omitempty"`
	Region      string            `yaml:"region" json:"region,omitempty"`
	Zone        string            `yaml:"zone" json:"zone,omitempty"`
	Registries  *Registries       `yaml:"registries" json:"registries,omitempty"`
	Addons      *Addons           `yaml:"addons" json:"addons,omitempty"`
	Labels      map[string]string `yaml:"labels" json:"labels,omitempty"`
	Workers     *int              `yaml:"workers" json:"workers,omitempty"`
}

// Registries selects mirrors: Mirrors nil or ["*"] = all, [] = none, or names.
type Registries struct {
	Mirrors *[]string `yaml:"mirrors" json:"mirrors,omitempty"`
}

// Addons are optional per-cluster installs.
type Addons struct {
	MetricsServer *MetricsServer `yaml:"metricsServer" json:"metricsServer,omitempty"`
}

// MetricsServer is the metrics-server addon.
type MetricsServer struct {
	Enabled            bool   `yaml:"enabled" json:"enabled"`
	Version            string `yaml:"version" json:"version,omitempty"`
	KubeletInsecureTLS bool   `yaml:"kubeletInsecureTLS" json:"kubeletInsecureTLS"`
}

// ClusterEntry is one member: a bare name or a mapping.
type ClusterEntry struct {
	Name        string            `yaml:"name" json:"name"`
	DependsOn   []string          `yaml:"dependsOn" json:"dependsOn,omitempty"`
	Num         int               `yaml:"num" json:"num,omitempty"`
	NodeVersion string            `yaml:"nodeVersion" json:"nodeVersion,omitempty"`
	Region      string            `yaml:"region" json:"region,omitempty"`
	Zone        string            `yaml:"zone" json:"zone,omitempty"`
	Labels      map[string]string `yaml:"labels" json:"labels,omitempty"`
	Registries  *Registries       `yaml:"registries" json:"registries,omitempty"`
	Addons      *Addons           `yaml:"addons" json:"addons,omitempty"`
	// Workers is the number of worker nodes (default spec.defaults.workers, else 0).
	Workers *int `yaml:"workers" json:"workers,omitempty"`
}

type plainEntry ClusterEntry

// YAMLSchema lets the strict key check see the mapping form's fields.
func (ClusterEntry) YAMLSchema() any { return plainEntry{} }

// UnmarshalYAML accepts "- dev" as well as "- name: dev ...".
func (c *ClusterEntry) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*c = ClusterEntry{Name: n.Value}
		return nil
	}
	var p plainEntry
	if err := n.Decode(&p); err != nil {
		return err
	}
	*c = ClusterEntry(p)
	return nil
}

// Load reads and validates a manifest file.
func Load(path string) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse decodes strictly (unknown keys rejected with their path) and validates.
func Parse(data []byte) (*Fleet, error) {
	var f Fleet
	if err := config.StrictUnmarshal(data, &f); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate checks the manifest and returns every problem found.
func (f *Fleet) Validate() error {
	var es config.Errors
	add := func(field, msg, fix string) { es = append(es, &config.FieldError{Field: field, Msg: msg, Fix: fix}) }
	if f.APIVersion != APIVersion {
		add("apiVersion", fmt.Sprintf("%q is not supported", f.APIVersion), "set apiVersion: "+APIVersion)
	}
	if f.Kind != Kind {
		add("kind", fmt.Sprintf("%q is not a Fleet", f.Kind), "set kind: Fleet")
	}
	if !config.IsDNSLabel(f.Metadata.Name, 63) {
		add("metadata.name", fmt.Sprintf("%q is not a valid fleet name", f.Metadata.Name), "use lower-case letters, digits and '-', e.g. demo")
	}
	if f.Spec.MaxParallel < 0 {
		add("spec.maxParallel", fmt.Sprintf("%d is negative", f.Spec.MaxParallel), "use 0 (default 1) or a positive number")
	}
	if s := f.Spec.Strategy; s != "" && s != FailFast && s != ContinueOnError {
		add("spec.strategy", fmt.Sprintf("unknown strategy %q", s), "use FailFast or ContinueOnError")
	}
	checkCommon(add, "spec.defaults", f.Spec.Defaults.NodeVersion, f.Spec.Defaults.Region, f.Spec.Defaults.Zone, f.Spec.Defaults.Labels, f.Spec.Defaults.Addons)
	checkWorkers(add, "spec.defaults.workers", f.Spec.Defaults.Workers)
	if len(f.Spec.Clusters) == 0 {
		add("spec.clusters", "no clusters", "list at least one cluster name")
	}
	names := map[string]int{}
	nums := map[int]int{}
	for i, c := range f.Spec.Clusters {
		p := fmt.Sprintf("spec.clusters[%d]", i)
		if err := cluster.ValidateName(c.Name); err != nil {
			add(p+".name", err.Error(), "rename the cluster")
		} else if j, dup := names[c.Name]; dup {
			add(p+".name", fmt.Sprintf("duplicate cluster name %q (also spec.clusters[%d])", c.Name, j), "give each cluster a unique name")
		} else {
			names[c.Name] = i
		}
		if c.Num != 0 {
			if c.Num < 1 || c.Num > 99 {
				add(p+".num", fmt.Sprintf("%d is out of range", c.Num), "use a slot number 1-99, or leave num out")
			} else if j, dup := nums[c.Num]; dup {
				add(p+".num", fmt.Sprintf("duplicate num %d (also spec.clusters[%d])", c.Num, j), "give each cluster a unique num")
			} else {
				nums[c.Num] = i
			}
		}
		checkCommon(add, p, c.NodeVersion, c.Region, c.Zone, c.Labels, c.Addons)
		checkWorkers(add, p+".workers", c.Workers)
	}
	for i, c := range f.Spec.Clusters {
		seen := map[string]bool{}
		for j, d := range c.DependsOn {
			p := fmt.Sprintf("spec.clusters[%d].dependsOn[%d]", i, j)
			switch _, ok := names[d]; {
			case d == c.Name:
				add(p, fmt.Sprintf("cluster %q depends on itself", c.Name), "remove it from its own dependsOn")
			case !ok:
				add(p, fmt.Sprintf("unknown cluster %q", d), "depend only on clusters listed in spec.clusters")
			case seen[d]:
				add(p, fmt.Sprintf("%q listed twice", d), "list each dependency once")
			}
			seen[d] = true
		}
	}
	if len(es) == 0 {
		if cyc := f.cycle(); cyc != nil {
			add("spec.clusters", "dependency cycle: "+strings.Join(cyc, " -> "), "remove one of these dependsOn entries")
		}
	}
	if len(es) > 0 {
		return es
	}
	return nil
}

func checkWorkers(add func(string, string, string), field string, n *int) {
	if n != nil && (*n < 0 || *n > cluster.MaxWorkers) {
		add(field, fmt.Sprintf("%d worker nodes is out of range", *n), fmt.Sprintf("use 0-%d (0 = a single control-plane node)", cluster.MaxWorkers))
	}
}

func checkCommon(add func(string, string, string), p, nodeVersion, region, zone string, labels map[string]string, addons *Addons) {
	if nodeVersion != "" && !strings.HasPrefix(nodeVersion, "v") || strings.ContainsAny(nodeVersion, " /:;$") {
		add(p+".nodeVersion", fmt.Sprintf("%q is not a kindest/node tag", nodeVersion), "use e.g. v1.35.0")
	}
	for _, field := range []string{"region", "zone"} {
		v := map[string]string{"region": region, "zone": zone}[field]
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			add(p+"."+field, fmt.Sprintf("%q: %s", v, strings.Join(errs, "; ")), "use letters, digits, '-', '_' and '.'")
		}
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			add(p+".labels."+k, strings.Join(errs, "; "), "use a valid Kubernetes label key")
		} else if cluster.Reserved(k) {
			add(p+".labels."+k, "label is managed by klimax", "remove it; fleet membership comes from metadata.name")
		} else if cluster.IsKubernetesLabel(k) && cluster.ValidateNodeLabel("", k, "") != nil {
			add(p+".labels."+k, "the kubelet refuses kubernetes.io/k8s.io node labels outside its allowed set (kind passes labels as --node-labels), so the cluster would never start",
				"use a key of your own domain, e.g. example.com/"+k[strings.Index(k, "/")+1:])
		}
		if errs := validation.IsValidLabelValue(labels[k]); len(errs) > 0 {
			add(p+".labels."+k, fmt.Sprintf("value %q: %s", labels[k], strings.Join(errs, "; ")), "use a valid Kubernetes label value")
		}
	}
	if addons != nil && addons.MetricsServer != nil && addons.MetricsServer.Version != "" {
		v := addons.MetricsServer.Version
		if !strings.HasPrefix(v, "v") || strings.ContainsAny(v, " /:;$") {
			add(p+".addons.metricsServer.version", fmt.Sprintf("%q is not a release tag", v), "use e.g. v0.8.0")
		}
	}
}

// cycle returns one dependency cycle as a path (first == last), or nil.
func (f *Fleet) cycle() []string {
	deps := map[string][]string{}
	for _, c := range f.Spec.Clusters {
		deps[c.Name] = c.DependsOn
	}
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, d := range deps[n] {
			if color[d] == grey {
				for i, s := range stack {
					if s == d {
						found = append(append([]string{}, stack[i:]...), d)
					}
				}
				return true
			}
			if color[d] == white && visit(d) {
				return true
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, c := range f.Spec.Clusters {
		if color[c.Name] == white && visit(c.Name) {
			return found
		}
	}
	return nil
}

// Resolved is one member with defaults applied.
type Resolved struct {
	Name          string
	DependsOn     []string
	Num           int
	NodeVersion   string
	Region, Zone  string
	Labels        map[string]string
	Mirrors       []string // nil = all
	MetricsServer cluster.MetricsServer
	Workers       int
}

// Resolve applies spec.defaults to each member.
func (f *Fleet) Resolve() []Resolved {
	d := f.Spec.Defaults
	out := make([]Resolved, 0, len(f.Spec.Clusters))
	for _, c := range f.Spec.Clusters {
		r := Resolved{Name: c.Name, DependsOn: c.DependsOn, Num: c.Num, NodeVersion: pick(c.NodeVersion, d.NodeVersion),
			Region: pick(c.Region, d.Region), Zone: pick(c.Zone, d.Zone), Labels: map[string]string{}}
		for k, v := range d.Labels {
			r.Labels[k] = v
		}
		for k, v := range c.Labels {
			r.Labels[k] = v
		}
		reg := c.Registries
		if reg == nil || reg.Mirrors == nil {
			reg = d.Registries
		}
		if reg != nil && reg.Mirrors != nil {
			r.Mirrors = append([]string{}, (*reg.Mirrors)...)
			for _, m := range r.Mirrors {
				if m == "*" {
					r.Mirrors = nil
					break
				}
			}
		}
		if c.Workers != nil {
			r.Workers = *c.Workers
		} else if d.Workers != nil {
			r.Workers = *d.Workers
		}
		ad := c.Addons
		if ad == nil || ad.MetricsServer == nil {
			ad = d.Addons
		}
		if ad != nil && ad.MetricsServer != nil {
			r.MetricsServer = cluster.MetricsServer{Enabled: ad.MetricsServer.Enabled, Version: ad.MetricsServer.Version, KubeletInsecureTLS: ad.MetricsServer.KubeletInsecureTLS}
		}
		out = append(out, r)
	}
	return out
}

func pick(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
