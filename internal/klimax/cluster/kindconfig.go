package cluster

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
)

// KindCluster is the subset of kind's v1alpha4 Cluster config klimax writes.
// It is our own type (kind's Go module is not a dependency); field names and
// shapes follow kind.x-k8s.io/v1alpha4.
type KindCluster struct {
	Kind                    string      `yaml:"kind"`
	APIVersion              string      `yaml:"apiVersion"`
	Name                    string      `yaml:"name"`
	Networking              KindNetwork `yaml:"networking"`
	ContainerdConfigPatches []string    `yaml:"containerdConfigPatches,omitempty"`
	Nodes                   []KindNode  `yaml:"nodes"`
}

// KindNetwork is kind's networking section.
type KindNetwork struct {
	APIServerAddress string `yaml:"apiServerAddress"`
	APIServerPort    int    `yaml:"apiServerPort"`
	PodSubnet        string `yaml:"podSubnet"`
	ServiceSubnet    string `yaml:"serviceSubnet"`
}

// KindNode is one kind node.
type KindNode struct {
	Role                 string            `yaml:"role"`
	Image                string            `yaml:"image"`
	Labels               map[string]string `yaml:"labels,omitempty"`
	KubeadmConfigPatches []string          `yaml:"kubeadmConfigPatches,omitempty"`
}

// Spec is everything that determines one cluster's generated artifacts.
type Spec struct {
	Name        string
	Slot        slot.Slot
	NodeVersion string // kindest/node tag, e.g. v1.35.0
	// NodeImage is the full node image reference; "" is kindest/node:<NodeVersion>.
	NodeImage string
	Region    string
	Zone      string
	Fleet     string
	DependsOn []string
	Labels    map[string]string
	// Workers is the number of worker nodes (0 = the control plane only).
	Workers int
	// ListenAddress is where the API server port is published in the guest
	// (0.0.0.0 in a VM so the host reaches it, 127.0.0.1 on a Linux host).
	ListenAddress string
	// APIHost is the address the kubeconfig uses; it goes into the cert SANs.
	APIHost string
}

// NodeLabels are the Kubernetes labels of the control-plane node.
func (s Spec) NodeLabels() map[string]string {
	l := map[string]string{}
	for k, v := range s.Labels {
		l[k] = v
	}
	l[LabelIngress] = "true"
	l[LabelManagedBy] = ManagedByValue
	l[LabelSlot] = fmt.Sprint(int(s.Slot))
	if s.Region != "" {
		l[LabelRegion] = s.Region
	}
	if s.Zone != "" {
		l[LabelZone] = s.Zone
	}
	if s.Fleet != "" {
		l[LabelFleet] = s.Fleet
	}
	for _, d := range s.DependsOn {
		l[DepLabelPrefix+d] = "true"
	}
	return l
}

// WorkerLabels are the Kubernetes labels of each worker node: the node
// labels without the control plane's ingress-ready and dependency records
// (klimax reads those from the control plane only).
func (s Spec) WorkerLabels() map[string]string {
	l := s.NodeLabels()
	delete(l, LabelIngress)
	for k := range l {
		if strings.HasPrefix(k, DepLabelPrefix) {
			delete(l, k)
		}
	}
	return l
}

// MaxWorkers bounds worker nodes per cluster: each is a full node container
// (kubelet, containerd) on the one machine.
const MaxWorkers = 10

// ValidateWorkers checks a worker count; field names where it came from.
func ValidateWorkers(field string, n int) error {
	if n < 0 || n > MaxWorkers {
		return fmt.Errorf("%s: %d worker nodes is out of range (fix: use 0-%d; 0 = a single control-plane node)", field, n, MaxWorkers)
	}
	return nil
}

// containerdCertsPatch points containerd's CRI registry config at certs.d,
// where klimax writes one hosts.toml per mirror.
const containerdCertsPatch = `[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"`

// kubeletPatch lets the kubelet start on a cgroup v1 host (Kubernetes 1.35
// and later refuse one unless failCgroupV1 is false); on cgroup v2 it has
// no effect.
const kubeletPatch = "kind: KubeletConfiguration\nfailCgroupV1: false\n"

// Image is the node image of s.
func (s Spec) Image() string {
	if s.NodeImage != "" {
		return s.NodeImage
	}
	return "kindest/node:" + s.NodeVersion
}

// KindConfig builds the kind cluster config for s.
func KindConfig(s Spec) (*KindCluster, error) {
	if err := ValidateName(s.Name); err != nil {
		return nil, err
	}
	if !s.Slot.Valid() {
		return nil, fmt.Errorf("slot %d out of range 1-99", s.Slot)
	}
	if err := ValidateWorkers("workers", s.Workers); err != nil {
		return nil, err
	}
	sans := []string{"127.0.0.1"}
	if s.APIHost != "" {
		if _, err := netip.ParseAddr(s.APIHost); err != nil {
			return nil, fmt.Errorf("API host %q is not an IP address", s.APIHost)
		}
		if s.APIHost != "127.0.0.1" {
			sans = []string{s.APIHost, "127.0.0.1"}
		}
	}
	listen := s.ListenAddress
	if listen == "" {
		listen = "127.0.0.1"
	}
	var san bytes.Buffer
	san.WriteString("kind: ClusterConfiguration\napiServer:\n  certSANs:\n")
	for _, a := range sans {
		fmt.Fprintf(&san, "  - %q\n", a)
	}
	nodes := []KindNode{{
		Role:                 "control-plane",
		Image:                s.Image(),
		Labels:               s.NodeLabels(),
		KubeadmConfigPatches: []string{san.String(), kubeletPatch},
	}}
	for i := 0; i < s.Workers; i++ {
		nodes = append(nodes, KindNode{Role: "worker", Image: s.Image(), Labels: s.WorkerLabels(),
			KubeadmConfigPatches: []string{kubeletPatch}})
	}
	return &KindCluster{
		Kind:       "Cluster",
		APIVersion: "kind.x-k8s.io/v1alpha4",
		Name:       s.Name,
		Networking: KindNetwork{
			APIServerAddress: listen,
			APIServerPort:    s.Slot.APIPort(),
			PodSubnet:        s.Slot.PodSubnet().String(),
			ServiceSubnet:    s.Slot.ServiceSubnet().String(),
		},
		ContainerdConfigPatches: []string{containerdCertsPatch},
		Nodes:                   nodes,
	}, nil
}

// Render encodes a kind config as YAML (fed to `kind create cluster --config -`).
func (k *KindCluster) Render() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(k); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
