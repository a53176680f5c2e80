package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

const stateVersion = 1

// stateFile is what netd keeps across restarts: the node's range and every
// address it handed out, so running pods keep theirs.
type stateFile struct {
	Version int    `json:"version"`
	PodCIDR string `json:"podCIDR,omitempty"`
	// The Service and cluster ranges of the last Configure (optional).
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// LastIP is the round-robin cursor, kept so a restart does not hand a
	// just-released address out again at once.
	LastIP string      `json:"lastIP,omitempty"`
	Pods   []podRecord `json:"pods"`
	// Mesh is the mesh of the last ConfigureMesh and SetMeshPeers, none
	// after RemoveMesh: public data only (the key stays in its file). A
	// restart loses the device with the process, and resync makes it
	// again from this. Absent in files of netds before the mesh.
	Mesh *meshRecord `json:"mesh,omitempty"`
}

type meshRecord struct {
	KeyRef     string          `json:"keyRef"`
	ListenPort uint16          `json:"listenPort"`
	Peers      []wire.MeshPeer `json:"peers,omitempty"`
}

type podRecord struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	IP        string `json:"ip"`
	// UserNS: the pod's namespaces are its runtime's (SetupPod FromPid).
	UserNS bool `json:"userns,omitempty"`
}

// pod is a record in memory.
type pod struct {
	uid, namespace, name string
	ip                   netip.Addr
	// userns: the pod's network namespace is its runtime's, in the
	// runtime's user namespace (SetupPodArgs.FromPid); netd never makes
	// one for it.
	userns bool
	// removing is set, and closed when done, while a teardown removes the
	// pod's network outside the lock; not persisted.
	removing chan struct{}
}

// loadState reads path; a missing file is an empty state. A file that does
// not parse or contradicts itself stops netd: guessing would take running
// pods' addresses away or hand them out twice.
func loadState(path string) (cidr netip.Prefix, last netip.Addr, rs ranges, pods map[string]*pod, mesh *meshState, err error) {
	cidr, last, rs, pods, rec, err := loadStateFile(path)
	if err != nil || rec == nil {
		return cidr, last, rs, pods, nil, err
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("state %s: mesh: %s (fix or remove the file; removing it forgets every pod's address)", path, fmt.Sprintf(format, a...))
	}
	if !cidr.IsValid() {
		return cidr, last, rs, nil, nil, fail("recorded without a podCIDR")
	}
	if err := wire.CheckConfigureMesh(&wire.ConfigureMeshArgs{KeyRef: rec.KeyRef, ListenPort: rec.ListenPort}); err != nil {
		return cidr, last, rs, nil, nil, fail("%v", err)
	}
	peers, err := wire.ParseMeshPeers(&wire.SetMeshPeersArgs{Peers: rec.Peers})
	if err != nil {
		return cidr, last, rs, nil, nil, fail("%v", err)
	}
	return cidr, last, rs, pods, &meshState{keyRef: rec.KeyRef, port: rec.ListenPort, peers: peers}, nil
}

func loadStateFile(path string) (cidr netip.Prefix, last netip.Addr, rs ranges, pods map[string]*pod, mesh *meshRecord, err error) {
	pods = map[string]*pod{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cidr, last, rs, pods, nil, nil
	}
	if err != nil {
		return cidr, last, rs, nil, nil, err
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("state %s: %s (fix or remove the file; removing it forgets every pod's address)", path, fmt.Sprintf(format, a...))
	}
	var st stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return cidr, last, rs, nil, nil, fail("%v", err)
	}
	if st.Version != stateVersion {
		return cidr, last, rs, nil, nil, fail("version %d, this netd reads %d", st.Version, stateVersion)
	}
	if st.PodCIDR == "" {
		if len(st.Pods) > 0 {
			return cidr, last, rs, nil, nil, fail("pods recorded without a podCIDR")
		}
		return cidr, last, rs, pods, st.Mesh, nil
	}
	if cidr, rs.svc, rs.cluster, err = wire.ParseRanges(&wire.ConfigureArgs{PodCIDR: st.PodCIDR, ServiceCIDR: st.ServiceCIDR, ClusterCIDR: st.ClusterCIDR}); err != nil {
		return cidr, last, rs, nil, nil, fail("%v", err)
	}
	if st.LastIP != "" {
		if last, err = netip.ParseAddr(st.LastIP); err != nil || !cidr.Contains(last) {
			return cidr, last, rs, nil, nil, fail("lastIP %q is not in %s", st.LastIP, cidr)
		}
	}
	used := map[netip.Addr]string{}
	for _, r := range st.Pods {
		ip, err := netip.ParseAddr(r.IP)
		switch {
		case wire.CheckUID(r.UID) != nil || wire.CheckNamespace(r.Namespace) != nil || wire.CheckName(r.Name) != nil:
			return cidr, last, rs, nil, nil, fail("pod %q/%q uid %q is not valid", r.Namespace, r.Name, r.UID)
		case err != nil || !usable(cidr, ip):
			return cidr, last, rs, nil, nil, fail("pod %s has IP %q, not a pod address of %s", r.UID, r.IP, cidr)
		case pods[r.UID] != nil:
			return cidr, last, rs, nil, nil, fail("pod %s recorded twice", r.UID)
		case used[ip] != "":
			return cidr, last, rs, nil, nil, fail("pods %s and %s share %s", used[ip], r.UID, ip)
		}
		used[ip] = r.UID
		pods[r.UID] = &pod{uid: r.UID, namespace: r.Namespace, name: r.Name, ip: ip, userns: r.UserNS}
	}
	return cidr, last, rs, pods, st.Mesh, nil
}

// saveState replaces path atomically (fsynced) with the state.
func saveState(path string, cidr netip.Prefix, last netip.Addr, rs ranges, pods map[string]*pod, mesh *meshState) error {
	st := stateFile{Version: stateVersion, Pods: []podRecord{}}
	if cidr.IsValid() {
		st.PodCIDR = cidr.String()
	}
	if rs.svc.IsValid() {
		st.ServiceCIDR = rs.svc.String()
	}
	if rs.cluster.IsValid() {
		st.ClusterCIDR = rs.cluster.String()
	}
	if last.IsValid() {
		st.LastIP = last.String()
	}
	for _, p := range sortedPods(pods) {
		st.Pods = append(st.Pods, podRecord{UID: p.uid, Namespace: p.namespace, Name: p.name, IP: p.ip.String(), UserNS: p.userns})
	}
	if mesh != nil {
		st.Mesh = &meshRecord{KeyRef: mesh.keyRef, ListenPort: mesh.port, Peers: mesh.wirePeers()}
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("state %s: %w", path, err)
	}
	return nil
}

// gateway is the node's address in cidr: its first host address.
// ranges are the optional Service and cluster ranges of the node.
type ranges struct{ svc, cluster netip.Prefix }

func gateway(cidr netip.Prefix) netip.Addr { return cidr.Addr().Next() }

// usable reports whether ip may be a pod's: in cidr, and not the network,
// the gateway or the broadcast address.
func usable(cidr netip.Prefix, ip netip.Addr) bool {
	return cidr.Contains(ip) && ip != cidr.Addr() && ip != gateway(cidr) && ip != dataplane.Broadcast(cidr)
}

// allocate returns the next free pod address after last, wrapping: an
// address just released is the last to be handed out again, so a stale
// client still talking to the old pod does not reach a new one.
func allocate(cidr netip.Prefix, last netip.Addr, used func(netip.Addr) bool) (netip.Addr, bool) {
	first, end := gateway(cidr).Next(), dataplane.Broadcast(cidr) // end is exclusive
	ip := last
	if !usable(cidr, ip) {
		ip = end.Prev()
	}
	n := 1 << (32 - cidr.Bits())
	for range n {
		if ip = ip.Next(); ip == end {
			ip = first
		}
		if !used(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
