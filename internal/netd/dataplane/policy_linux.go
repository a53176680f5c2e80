package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NetworkPolicy on Linux: two tables of k3sm's own, so EnsureNode (which
// replaces table ip k3sm) never touches them.
//
//	table ip k3sm-policy
//	  map ingress { ipv4_addr : verdict }   pod IP : jump <hostIf>-in
//	  map egress  { ipv4_addr : verdict }   pod IP : jump <hostIf>-eg
//	  chain forward (hook forward, policy accept)
//	    ct state established,related accept
//	    ip saddr vmap @egress
//	    ip daddr vmap @ingress
//	  chain <hostIf>-eg: a rule per allowed peer set and protocol, "return"; drop
//	  chain <hostIf>-in: the same for sources, "accept"; drop
//
//	table bridge k3sm-guard
//	  map guard { ifname : verdict }        host veth : jump <hostIf>
//	  chain prerouting (hook prerouting)
//	    iifname vmap @guard
//	  chain <hostIf>: ip saddr <pod IP> return; arp saddr ip <pod IP> return; drop
//
// Pod-to-pod traffic is bridged, and the bridge family has no connection
// tracking unless nf_conntrack_bridge is built (it is not on every kernel:
// `ct state` in a bridge table fails there). br_netfilter instead passes
// bridged IPv4 through the ip family's hooks with conntrack, so the policy
// lives in an ip table matched by address, and the bridge table makes the
// address trustworthy: a pod's port forwards only frames with its own
// source address (and ARP for it), nothing else (no IPv6 around the
// policy). Egress chains return so the destination's ingress chain still
// runs; established traffic is accepted first, so a change never cuts a
// connection it allowed. Traffic between a pod and the node itself goes
// through the input and output hooks, which k3sm leaves open.
const (
	policyTable    = "k3sm-policy"
	guardTable     = "k3sm-guard"
	ingressMap     = "ingress"
	egressMap      = "egress"
	guardMap       = "guard"
	forwardBase    = "forward"
	preroutingBase = "prerouting"
)

func ingressChain(hostIf string) string { return hostIf + "-in" }
func egressChain(hostIf string) string  { return hostIf + "-eg" }

// nftState is what of our two tables exists.
type nftState struct {
	policy, guard bool                             // the table with its base chain and maps
	chains        map[string]bool                  // "<family>/<chain>" of our tables
	elems         map[string][]nftables.SetElement // by map name
}

func readNFTState(c *nftables.Conn) (nftState, error) {
	st := nftState{chains: map[string]bool{}, elems: map[string][]nftables.SetElement{}}
	for _, tb := range []struct {
		family nftables.TableFamily
		name   string
		base   string
		maps   []string
		ok     *bool
	}{
		{nftables.TableFamilyIPv4, policyTable, forwardBase, []string{ingressMap, egressMap}, &st.policy},
		{nftables.TableFamilyBridge, guardTable, preroutingBase, []string{guardMap}, &st.guard},
	} {
		tables, err := c.ListTablesOfFamily(tb.family)
		if err != nil {
			return st, fmt.Errorf("dataplane: list nftables tables: %w", err)
		}
		i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == tb.name })
		if i < 0 {
			continue
		}
		t := tables[i]
		chains, err := c.ListChainsOfTableFamily(tb.family)
		if err != nil {
			return st, fmt.Errorf("dataplane: list nftables chains: %w", err)
		}
		ok := false
		for _, ch := range chains {
			if ch.Table != nil && ch.Table.Name == tb.name {
				st.chains[chainKey(tb.family, ch.Name)] = true
				ok = ok || ch.Name == tb.base
			}
		}
		sets, err := c.GetSets(t)
		if err != nil {
			return st, fmt.Errorf("dataplane: list sets of %s: %w", tb.name, err)
		}
		found := 0
		for _, s := range sets {
			if !slices.Contains(tb.maps, s.Name) {
				continue
			}
			found++
			els, err := c.GetSetElements(s)
			if err != nil {
				return st, fmt.Errorf("dataplane: elements of %s %s: %w", tb.name, s.Name, err)
			}
			st.elems[s.Name] = els
		}
		*tb.ok = ok && found == len(tb.maps)
	}
	return st, nil
}

func chainKey(f nftables.TableFamily, name string) string { return fmt.Sprintf("%d/%s", f, name) }

// policyObjects are our two tables and their maps, as a batch refers to them.
type policyObjects struct {
	pt, gt           *nftables.Table
	in, eg, guardMap *nftables.Set
}

func mapOf(t *nftables.Table, name string, key nftables.SetDatatype) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, KeyType: key, IsMap: true, DataType: nftables.TypeVerdict}
}

// guardMapOf is the guard map, its interface names declared in host order
// as nft declares them: undeclared, nft reads them as big-endian numbers,
// turns the bytes around to print them and shows every name as "".
func guardMapOf(t *nftables.Table) *nftables.Set {
	m := mapOf(t, guardMap, nftables.TypeIFName)
	m.KeyByteOrder = binaryutil.NativeEndian
	return m
}

// ensureTables adds to the batch whatever of the two tables is missing or
// damaged (rebuilt empty: st forgets what was in it, and the node's next
// resync sends every pod again).
func ensureTables(c *nftables.Conn, st *nftState) (policyObjects, error) {
	var o policyObjects
	o.pt = &nftables.Table{Family: nftables.TableFamilyIPv4, Name: policyTable}
	o.gt = &nftables.Table{Family: nftables.TableFamilyBridge, Name: guardTable}
	o.in = mapOf(o.pt, ingressMap, nftables.TypeIPAddr)
	o.eg = mapOf(o.pt, egressMap, nftables.TypeIPAddr)
	o.guardMap = guardMapOf(o.gt)
	forget := func(f nftables.TableFamily, maps ...string) {
		for k := range st.chains {
			if strings.HasPrefix(k, fmt.Sprintf("%d/", f)) {
				delete(st.chains, k)
			}
		}
		for _, m := range maps {
			delete(st.elems, m)
		}
	}
	if !st.policy {
		freshTable(c, o.pt)
		forget(nftables.TableFamilyIPv4, ingressMap, egressMap)
		for _, m := range []*nftables.Set{o.in, o.eg} {
			if err := c.AddSet(m, nil); err != nil {
				return o, fmt.Errorf("dataplane: map %s: %w", m.Name, err)
			}
		}
		accept := nftables.ChainPolicyAccept
		fwd := c.AddChain(&nftables.Chain{Name: forwardBase, Table: o.pt, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		c.AddRule(&nftables.Rule{Table: o.pt, Chain: fwd, Exprs: []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		for _, d := range []struct {
			offset uint32
			m      *nftables.Set
		}{{12, o.eg}, {16, o.in}} { // source: the sender's egress; destination: the receiver's ingress
			c.AddRule(&nftables.Rule{Table: o.pt, Chain: fwd, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: d.offset, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: d.m.Name, SetID: d.m.ID, DestRegister: 0, IsDestRegSet: true},
			}})
		}
		st.policy = true
	}
	if !st.guard {
		freshTable(c, o.gt)
		forget(nftables.TableFamilyBridge, guardMap)
		if err := c.AddSet(o.guardMap, nil); err != nil {
			return o, fmt.Errorf("dataplane: map %s: %w", guardMap, err)
		}
		accept := nftables.ChainPolicyAccept
		pre := c.AddChain(&nftables.Chain{Name: preroutingBase, Table: o.gt, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-200), Policy: &accept})
		c.AddRule(&nftables.Rule{Table: o.gt, Chain: pre, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: o.guardMap.Name, SetID: o.guardMap.ID, DestRegister: 0, IsDestRegSet: true},
		}})
		st.guard = true
	}
	return o, nil
}

// delPodObjects adds to the batch the removal of everything of the pod's
// in our tables: map elements first (they jump to the chains), then the
// chains. ip, when valid, also clears an element for the address left by
// another interface.
func delPodObjects(c *nftables.Conn, st nftState, o policyObjects, hostIf string, ip []byte) error {
	for _, m := range []*nftables.Set{o.in, o.eg} {
		var del []nftables.SetElement
		for _, e := range st.elems[m.Name] {
			if e.Comment == hostIf || (ip != nil && string(e.Key) == string(ip)) {
				del = append(del, nftables.SetElement{Key: e.Key})
			}
		}
		if len(del) > 0 {
			if err := c.SetDeleteElements(m, del); err != nil {
				return fmt.Errorf("dataplane: map %s: %w", m.Name, err)
			}
		}
	}
	key := ifnameBytes(hostIf)
	for _, e := range st.elems[guardMap] {
		if string(e.Key) == string(key) {
			if err := c.SetDeleteElements(o.guardMap, []nftables.SetElement{{Key: key}}); err != nil {
				return fmt.Errorf("dataplane: map %s: %w", guardMap, err)
			}
		}
	}
	for _, ch := range []struct {
		t    *nftables.Table
		name string
	}{{o.pt, ingressChain(hostIf)}, {o.pt, egressChain(hostIf)}, {o.gt, hostIf}} {
		if st.chains[chainKey(ch.t.Family, ch.name)] {
			c.FlushChain(&nftables.Chain{Table: ch.t, Name: ch.name})
			c.DelChain(&nftables.Chain{Table: ch.t, Name: ch.name})
		}
	}
	return nil
}

func (d *linuxPlane) SetPolicy(n Node, p Pod, pol Policy) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if err := checkPodIP(n, p.IP); err != nil {
		return err
	}
	if err := d.checkPodNames(p); err != nil {
		return err
	}
	if err := checkPolicy(pol); err != nil {
		return err
	}
	if pol.Ingress.Isolated || pol.Egress.Isolated {
		if err := d.ensureBridgeHooks(); err != nil {
			return err
		}
	}
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	st, err := readNFTState(c)
	if err != nil {
		return err
	}
	o, err := ensureTables(c, &st)
	if err != nil {
		return err
	}
	ip := p.IP.AsSlice()
	// Everything of the pod goes and comes back in one batch: the kernel
	// applies it whole or not at all, and no packet sees half of it.
	if err := delPodObjects(c, st, o, p.HostIf, ip); err != nil {
		return err
	}
	guard := c.AddChain(&nftables.Chain{Name: p.HostIf, Table: o.gt})
	for _, r := range guardRules(ip) {
		c.AddRule(&nftables.Rule{Table: o.gt, Chain: guard, Exprs: r})
	}
	if err := c.SetAddElements(o.guardMap, []nftables.SetElement{{Key: ifnameBytes(p.HostIf),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: guard.Name}}}); err != nil {
		return fmt.Errorf("dataplane: map %s: %w", guardMap, err)
	}
	for _, side := range []struct {
		d       Direction
		m       *nftables.Set
		chain   string
		offset  uint32 // the peer's address: source for ingress, destination for egress
		verdict expr.VerdictKind
	}{
		{pol.Ingress, o.in, ingressChain(p.HostIf), 12, expr.VerdictAccept},
		// Return: the destination's ingress chain decides next.
		{pol.Egress, o.eg, egressChain(p.HostIf), 16, expr.VerdictReturn},
	} {
		if !side.d.Isolated {
			continue
		}
		ch := c.AddChain(&nftables.Chain{Name: side.chain, Table: o.pt})
		rules, err := directionRules(c, o.pt, side.d, side.offset, side.verdict)
		if err != nil {
			return err
		}
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: o.pt, Chain: ch, Exprs: r})
		}
		if err := c.SetAddElements(side.m, []nftables.SetElement{{Key: ip, Comment: p.HostIf,
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
			return fmt.Errorf("dataplane: map %s: %w", side.m.Name, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: NetworkPolicy of %s: %w", p.HostIf, err)
	}
	return nil
}

// delPolicy removes the pod's policy and guard (DelPod). Our tables may
// not exist: no pod ever had a policy.
func (d *linuxPlane) delPolicy(hostIf string) error {
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	st, err := readNFTState(c)
	if err != nil {
		return err
	}
	o := policyObjects{
		pt: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: policyTable},
		gt: &nftables.Table{Family: nftables.TableFamilyBridge, Name: guardTable},
	}
	o.in, o.eg, o.guardMap = mapOf(o.pt, ingressMap, nftables.TypeIPAddr), mapOf(o.pt, egressMap, nftables.TypeIPAddr), guardMapOf(o.gt)
	if err := delPodObjects(c, st, o, hostIf, nil); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: remove the NetworkPolicy of %s: %w", hostIf, err)
	}
	return nil
}

// delPolicyTables removes both tables (DelNode).
func (d *linuxPlane) delPolicyTables() error {
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	for _, t := range []*nftables.Table{
		{Family: nftables.TableFamilyIPv4, Name: policyTable},
		{Family: nftables.TableFamilyBridge, Name: guardTable},
	} {
		dropTable(c, t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: remove the NetworkPolicy tables: %w", err)
	}
	return nil
}

// ensureBridgeHooks makes bridged IPv4 pass the ip family's hooks
// (br_netfilter), without which pod-to-pod traffic never meets the policy.
// It is the setting Kubernetes network plugins require; k3sm sets it only
// once a pod is isolated.
func (d *linuxPlane) ensureBridgeHooks() error {
	const knob = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	return onThread(d.hostNS, func() error {
		v, err := os.ReadFile(knob)
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("dataplane: NetworkPolicy needs br_netfilter so that bridged pod traffic passes the IPv4 hooks (modprobe br_netfilter)")
		}
		if err != nil {
			return fmt.Errorf("dataplane: %s: %w", knob, err)
		}
		if strings.TrimSpace(string(v)) == "1" {
			return nil
		}
		if err := os.WriteFile(knob, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("dataplane: enable br_netfilter for the pod bridge: %w", err)
		}
		return nil
	})
}

// guardRules: the pod's port forwards IPv4 from the pod's address and ARP
// for it, and drops the rest.
func guardRules(ip []byte) [][]expr.Any {
	proto := func(etherType uint16) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, etherType)},
		}
	}
	src := func(offset uint32) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}
	}
	return [][]expr.Any{
		append(proto(unix.ETH_P_IP), src(12)...),
		// The sender protocol address of an Ethernet/IPv4 ARP packet.
		append(proto(unix.ETH_P_ARP), src(14)...),
		{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}},
	}
}

// directionRules renders one isolated side: per rule and protocol one
// rule of anonymous interval sets (bound to the rule, so they go with the
// chain), ending in drop.
func directionRules(c *nftables.Conn, t *nftables.Table, d Direction, offset uint32, verdict expr.VerdictKind) ([][]expr.Any, error) {
	var out [][]expr.Any
	for _, r := range d.Rules {
		var ranges []addrRange
		if len(r.Peers) > 0 {
			if ranges = peerRanges(r.Peers); len(ranges) == 0 {
				continue // every address excepted: the rule allows nothing
			}
			if len(ranges) == 1 && ranges[0] == (addrRange{0, math.MaxUint32}) {
				ranges = nil // 0.0.0.0/0: any address
			}
		}
		peers := func() ([]expr.Any, error) {
			if ranges == nil {
				return nil, nil
			}
			s := &nftables.Set{Table: t, Anonymous: true, Constant: true, Interval: true, KeyType: nftables.TypeIPAddr}
			if err := c.AddSet(s, intervalElems(ranges, math.MaxUint32, 4)); err != nil {
				return nil, fmt.Errorf("dataplane: peer set: %w", err)
			}
			return []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
			}, nil
		}
		if len(r.Ports) == 0 {
			e, err := peers()
			if err != nil {
				return nil, err
			}
			out = append(out, append(e, &expr.Counter{}, &expr.Verdict{Kind: verdict}))
			continue
		}
		for _, proto := range []Protocol{TCP, UDP, SCTP} {
			var ports []addrRange
			all, used := false, false
			for _, p := range r.Ports {
				if p.Protocol != proto {
					continue
				}
				used = true
				switch {
				case p.Port == 0:
					all = true
				case p.EndPort == 0:
					ports = append(ports, addrRange{uint32(p.Port), uint32(p.Port)})
				default:
					ports = append(ports, addrRange{uint32(p.Port), uint32(p.EndPort)})
				}
			}
			if !used {
				continue
			}
			e, err := peers()
			if err != nil {
				return nil, err
			}
			e = append(e,
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(proto)}})
			if !all {
				s := &nftables.Set{Table: t, Anonymous: true, Constant: true, Interval: true, KeyType: nftables.TypeInetService}
				if err := c.AddSet(s, intervalElems(mergeRanges(ports), math.MaxUint16, 2)); err != nil {
					return nil, fmt.Errorf("dataplane: port set: %w", err)
				}
				e = append(e,
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
					&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
			}
			out = append(out, append(e, &expr.Counter{}, &expr.Verdict{Kind: verdict}))
		}
	}
	return append(out, []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}), nil
}

// intervalElems encodes sorted disjoint ranges as nft does for an interval
// set: a start element, and an end element one past the range unless the
// range runs to the top; a leading end at zero when the first range does
// not start there.
func intervalElems(rs []addrRange, top uint32, width int) []nftables.SetElement {
	key := func(v uint32) []byte {
		if width == 2 {
			return binary.BigEndian.AppendUint16(nil, uint16(v))
		}
		return binary.BigEndian.AppendUint32(nil, v)
	}
	var out []nftables.SetElement
	if len(rs) > 0 && rs[0].lo != 0 {
		out = append(out, nftables.SetElement{Key: key(0), IntervalEnd: true})
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: key(r.lo)})
		if r.hi != top {
			out = append(out, nftables.SetElement{Key: key(r.hi + 1), IntervalEnd: true})
		}
	}
	return out
}
