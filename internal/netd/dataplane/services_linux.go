package dataplane

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Services in the kernel (ClusterIPs, externalIPs, nodePorts and
// load-balancer ingresses on the node's addresses), the way kube-proxy's
// nftables mode does it, in a table of k3sm's own that
// SetServices rebuilds whole in one transaction (existing connections
// keep their translation: conntrack holds it, not the rules):
//
//	table ip k3sm-services
//	  map services     { ipv4_addr . inet_proto . inet_service : verdict }  → goto svc-…
//	  map node-ports   { the same }  → goto svc-…  a node address (OnNode)
//	  map no-endpoints { the same }  → goto reject
//	  map no-endpoints-node { the same }  → goto reject  a node address
//	  set hairpin      { ipv4_addr . ipv4_addr }                            every endpoint, twice
//	  chain prerouting  (nat, dstnat)  ip daddr . meta l4proto . th dport vmap @services
//	                                   fib daddr type local ip daddr . meta l4proto . th dport vmap @node-ports
//	  chain output      (nat, dstnat)  the same, for the node's own processes
//	  chain postrouting (nat, srcnat)  ip saddr . ip daddr @hairpin masquerade
//	                                   ct mark & 0x01000000 == 0x01000000 return   a Local port (localMark)
//	                                   ct status dnat oifname <bridge> ip saddr != <pod CIDR> masquerade
//	  chain input, chain output-filter (filter, -10)  ip daddr . meta l4proto . th dport vmap @no-endpoints
//	                                   (input only) the same, vmap @no-endpoints-node
//	  chain forward     (filter, -10)  the same: an externalIP is routed, not local
//	  chain reject      tcp: reset; else icmp port-unreachable
//	  chain svc-<ip:port-proto>          (Local ports) ct mark set ct mark | 0x01000000
//	                                     numgen random mod N vmap { 0 : goto ep-…, … }
//	                                     (over 128 endpoints: vmap @eps-<ip:port-proto>, a map of its own)
//	  chain ep-<ip:port-proto>-<ep>      dnat to <ep>
//
// Every expression is one nft parses back: `nft list table ip
// k3sm-services` works with Debian 12's nft 1.0.6 (TestNFTListsRules).
//
// An externalIP is not in the Service range's local route: with endpoints
// the dstnat chains translate it before routing, as a ClusterIP; without,
// a pod's packet to it would be routed on, out of the node to whoever
// really has the address, so the forward chain refuses it as kube-proxy
// does (the node's own are refused in output-filter, and one that is the
// node's address in input).
//
// A node address (a nodePort, or a load-balancer ingress, which on k3sm is
// the node's address) is translated only while it is local (fib), so an
// address the node lost is not intercepted on its way elsewhere; without
// endpoints it is refused in input, which also sees the node's own
// connections to itself.
//
// externalTrafficPolicy: Local keeps the client's address: a connection
// its Service chain marked (localMark) is not masqueraded on its way to
// the bridge, and its endpoints are all this node's pods, whose
// replies come back through the node (their default route) where
// conntrack undoes the DNAT. With Cluster, a client beyond the node is
// masqueraded to the gateway, as kube-proxy does.
//
// Pod-to-Service traffic keeps the client pod's address, so the policy
// table's forward chain (priority filter, after dstnat) sees the real
// source and the backend as destination. Only a pod reaching itself is
// masqueraded (to the gateway): a packet from its own address would be
// dropped as a martian. Traffic the node sends is masqueraded to the
// gateway as well, as the node's direct connections to pods already are.
//
// The backend's reply to a pod on the same bridge is bridged, not routed:
// only br_netfilter (bridge-nf-call-iptables) passes it through the IPv4
// hooks where conntrack restores the ClusterIP as its source, so
// SetServices turns it on, as kube-proxy requires. A pod reaching itself
// needs the bridge to send the frame back out of the port it came in by:
// AddPod sets hairpin mode on every pod's port.
const (
	servicesTable    = "k3sm-services"
	servicesMap      = "services"
	nodePortsMap     = "node-ports"
	noEndpointsMap   = "no-endpoints"
	noEndpointsNode  = "no-endpoints-node"
	hairpinSet       = "hairpin"
	rejectChain      = "reject"
	svcChainPrefix   = "svc-"
	epChainPrefix    = "ep-"
	epMapPrefix      = "eps-"
	natPreChain      = "prerouting"
	natOutChain      = "output"
	natPostChain     = "postrouting"
	filterInChain    = "input"
	filterOutChain   = "output-filter"
	filterFwdChain   = "forward"
	filterPriorityEP = -10 // before the usual filter chains: a refused Service port never reaches a socket
)

// 32-bit registers for concatenated keys (NFT_REG32_00 overlaps NFT_REG_1).
const (
	reg32x0 = 8
	reg32x1 = 9
	reg32x2 = 10
)

// servicesSocketBuffer holds the largest set checkServices admits
// (maxServiceEndpointsTotal endpoint chains, ~300 bytes of netlink each,
// plus the Services') and the acknowledgements of its messages: the
// kernel refuses a message over the send buffer and drops acks over the
// receive buffer. Memory is charged only while a transaction is in flight.
const servicesSocketBuffer = 64 << 20

// ipsDstNAT is IPS_DST_NAT of ct status (host byte order).
const ipsDstNAT = 1 << 5

// localMark is the ct mark bit a connection to a Local port gets when it
// is translated, which tells postrouting not to masquerade it. Looking its
// original destination up there instead (ct original ip daddr . ct
// original protocol . ct original proto-dst in a set) made Debian 12's nft
// 1.0.6 abort on the table (netlink_parse_concat_expr: Assertion
// `consumed > 0' failed): it cannot size ct's address inside a
// concatenation, and google/nftables cannot send the sized ct ip daddr
// (without its direction the kernel refuses it). Only this bit is set and
// tested; the rest of the mark stays whoever else's.
const localMark = 0x01000000

func (d *linuxPlane) SetServices(n Node, svcs []Service) error {
	if err := checkServices(n, svcs); err != nil {
		return err
	}
	// The node resends its whole set every minute (netd keeps no copy): an
	// unchanged set whose table is still there is not rebuilt, which would
	// hold netd's lock (and pod set-ups) for seconds on a large cluster.
	sum, err := servicesDigest(n, svcs)
	if err != nil {
		return err
	}
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	if sum == d.svcApplied {
		if c, err := d.nftConn(); err == nil {
			if _, err := c.ListTableOfFamily(servicesTable, nftables.TableFamilyIPv4); err == nil {
				return nil
			}
		}
	}
	d.svcApplied = [32]byte{}
	if slices.ContainsFunc(svcs, func(s Service) bool { return len(s.Endpoints) > 0 }) {
		if err := d.ensureBridgeHooks(); err != nil {
			return err
		}
	}
	// The whole set is one netlink message; a cluster's worth (thousands
	// of chains) is larger than the default send buffer.
	c, err := nftables.New(nftables.WithNetNSFd(int(d.hostNS)), nftables.WithSockOptions(func(nc *netlink.Conn) error {
		raw, err := nc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			// And the kernel's acknowledgement of every message in it.
			serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, servicesSocketBuffer),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, servicesSocketBuffer))
		}); err != nil {
			return err
		}
		return serr
	}))
	if err != nil {
		return fmt.Errorf("dataplane: nftables: %w", err)
	}
	t := freshTable(c, &nftables.Table{Family: nftables.TableFamilyIPv4, Name: servicesTable})

	keyType := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	svcMap := &nftables.Set{Table: t, Name: servicesMap, KeyType: keyType, Concatenation: true, IsMap: true, DataType: nftables.TypeVerdict}
	nodeMap := &nftables.Set{Table: t, Name: nodePortsMap, KeyType: keyType, Concatenation: true, IsMap: true, DataType: nftables.TypeVerdict}
	noEP := &nftables.Set{Table: t, Name: noEndpointsMap, KeyType: keyType, Concatenation: true, IsMap: true, DataType: nftables.TypeVerdict}
	noEPNode := &nftables.Set{Table: t, Name: noEndpointsNode, KeyType: keyType, Concatenation: true, IsMap: true, DataType: nftables.TypeVerdict}
	hairpin := &nftables.Set{Table: t, Name: hairpinSet, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr), Concatenation: true}
	for _, s := range []*nftables.Set{svcMap, nodeMap, noEP, noEPNode, hairpin} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("dataplane: set %s: %w", s.Name, err)
		}
	}

	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	}
	lookup := func(m *nftables.Set) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32x1},
			&expr.Payload{DestRegister: reg32x2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: reg32x0, SetName: m.Name, SetID: m.ID, DestRegister: 0, IsDestRegSet: true},
		}
	}
	for _, ch := range []*nftables.Chain{
		base(natPreChain, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest),
		base(natOutChain, nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: lookup(svcMap)})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(fibLocal(), lookup(nodeMap)...)})
	}
	input := base(filterInChain, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityRef(filterPriorityEP))
	for _, ch := range []*nftables.Chain{
		input,
		base(filterOutChain, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityRef(filterPriorityEP)),
		base(filterFwdChain, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityRef(filterPriorityEP)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: lookup(noEP)})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: lookup(noEPNode)})
	post := base(natPostChain, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{
		&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: reg32x1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: reg32x0, SetName: hairpin.Name, SetID: hairpin.ID},
		&expr.Counter{},
		&expr.Masq{},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, localMark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, localMark)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(n.Bridge)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte(net.CIDRMask(n.CIDR.Bits(), 32)), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: n.CIDR.Addr().AsSlice()},
		&expr.Counter{},
		&expr.Masq{},
	}})

	reject := c.AddChain(&nftables.Chain{Name: rejectChain, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: reject, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Counter{},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: reject, Exprs: []expr.Any{
		&expr.Counter{},
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}, // port unreachable
	}})

	var svcElems, nodeElems, noEPElems, noEPNodeElems, hairpinElems []nftables.SetElement
	hairpins := map[[4]byte]bool{}
	for _, s := range svcs {
		k := serviceKey{s.Protocol, s.IP, s.Port}
		key := serviceMapKey(s)
		if len(s.Endpoints) == 0 {
			el := nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: rejectChain}}
			if s.OnNode {
				noEPNodeElems = append(noEPNodeElems, el)
			} else {
				noEPElems = append(noEPElems, el)
			}
			continue
		}
		svc := c.AddChain(&nftables.Chain{Name: svcChainPrefix + chainPart(k.ip, k.port, k.proto), Table: t})
		if s.Local {
			// ct mark set ct mark | localMark
			c.AddRule(&nftables.Rule{Table: t, Chain: svc, Exprs: []expr.Any{
				&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
					Mask: binary.NativeEndian.AppendUint32(nil, ^uint32(localMark)), Xor: binary.NativeEndian.AppendUint32(nil, localMark)},
				&expr.Ct{Register: 1, Key: expr.CtKeyMARK, SourceRegister: true},
			}})
		}
		// An endpoint's index is a big-endian key (numgen's host-order
		// number goes through hton): google/nftables declares every
		// anonymous set's keys big-endian, and nft reads the keys in the
		// order the set declares (a host-order 1 was listed as 16777216).
		pick := &nftables.Set{Table: t, Anonymous: true, Constant: true, IsMap: true, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
		if len(s.Endpoints) > elementsPerMessage {
			// Too many for one message, and an anonymous set takes its
			// elements in one: a named map of its own.
			pick = &nftables.Set{Table: t, Name: epMapPrefix + chainPart(k.ip, k.port, k.proto), IsMap: true,
				KeyType: nftables.TypeInteger, KeyByteOrder: binaryutil.BigEndian, DataType: nftables.TypeVerdict}
		}
		var picks []nftables.SetElement
		for i, e := range s.Endpoints {
			ep := c.AddChain(&nftables.Chain{Name: epChainPrefix + chainPart(k.ip, k.port, k.proto) + "-" + chainPart(e.Addr(), e.Port(), 0), Table: t})
			ip := e.Addr().As4()
			c.AddRule(&nftables.Rule{Table: t, Chain: ep, Exprs: []expr.Any{
				&expr.Counter{},
				&expr.Immediate{Register: 1, Data: ip[:]},
				&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, e.Port())},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
			}})
			picks = append(picks, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(i)),
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ep.Name}})
			if !hairpins[ip] {
				hairpins[ip] = true
				hairpinElems = append(hairpinElems, nftables.SetElement{Key: append(ip[:], ip[:]...)})
			}
		}
		if pick.Anonymous {
			err = c.AddSet(pick, picks)
		} else if err = c.AddSet(pick, nil); err == nil {
			err = addElements(c, pick, picks)
		}
		if err != nil {
			return fmt.Errorf("dataplane: endpoints of %s: %w", k, err)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: svc, Exprs: []expr.Any{
			&expr.Numgen{Register: 1, Modulus: uint32(len(s.Endpoints)), Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Lookup{SourceRegister: 1, SetName: pick.Name, SetID: pick.ID, DestRegister: 0, IsDestRegSet: true},
		}})
		el := nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: svc.Name}}
		if s.OnNode {
			nodeElems = append(nodeElems, el)
		} else {
			svcElems = append(svcElems, el)
		}
	}
	for _, add := range []struct {
		s  *nftables.Set
		es []nftables.SetElement
	}{{svcMap, svcElems}, {nodeMap, nodeElems}, {noEP, noEPElems}, {noEPNode, noEPNodeElems}, {hairpin, hairpinElems}} {
		if len(add.es) == 0 {
			continue
		}
		if err := addElements(c, add.s, add.es); err != nil {
			return fmt.Errorf("dataplane: set %s: %w", add.s.Name, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: nftables table ip %s (%d Service ports): %w", servicesTable, len(svcs), err)
	}
	d.svcApplied = sum
	return nil
}

// fibLocal matches a packet whose destination is a local address of the
// host (fib daddr type local).
func fibLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

// servicesDigest identifies what SetServices was given.
func servicesDigest(n Node, svcs []Service) ([32]byte, error) {
	b, err := json.Marshal(struct {
		Node     Node
		Services []Service
	}{n, svcs})
	if err != nil {
		return [32]byte{}, fmt.Errorf("dataplane: services: %w", err)
	}
	return sha256.Sum256(b), nil
}

// elementsPerMessage keeps one message's element list well under the
// 64 KiB a netlink attribute's 16-bit length can say (an element with a
// verdict and its chain name is ~100 bytes): google/nftables puts every
// element of one call in one attribute, and with 1000 elements in one
// call the map was seen to lack some.
const elementsPerMessage = 128

// addElements adds es to s in messages of elementsPerMessage, all in the
// one transaction.
func addElements(c *nftables.Conn, s *nftables.Set, es []nftables.SetElement) error {
	for len(es) > 0 {
		n := min(len(es), elementsPerMessage)
		if err := c.SetAddElements(s, es[:n]); err != nil {
			return err
		}
		es = es[n:]
	}
	return nil
}

// chainPart names a Service port or an endpoint in a chain name, in
// characters nft prints without quotes: 10.43.0.10-80-tcp, 100.64.0.5-8080.
func chainPart(ip netip.Addr, port uint16, proto Protocol) string {
	s := fmt.Sprintf("%s-%d", ip, port)
	switch proto {
	case TCP:
		s += "-tcp"
	case UDP:
		s += "-udp"
	}
	return s
}

// serviceMapKey is ip . l4proto . port as nft lays out a concatenation:
// every field in 4-byte registers, zero-padded.
func serviceMapKey(s Service) []byte {
	ip := s.IP.As4()
	key := append([]byte{}, ip[:]...)
	key = append(key, byte(s.Protocol), 0, 0, 0)
	key = binary.BigEndian.AppendUint16(key, s.Port)
	return append(key, 0, 0)
}

// delServices removes the Services table (DelNode).
func (d *linuxPlane) delServices() error {
	d.svcMu.Lock()
	d.svcApplied = [32]byte{}
	d.svcMu.Unlock()
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	dropTable(c, &nftables.Table{Family: nftables.TableFamilyIPv4, Name: servicesTable})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: remove table ip %s: %w", servicesTable, err)
	}
	return nil
}
