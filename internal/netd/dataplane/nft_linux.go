package dataplane

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

// natTable is k3sm's own nftables table; it holds only the masquerade, so
// replacing it never touches anyone else's rules.
const natTable = "k3sm"

// The iptables-nft filter chain Docker (and firewalld, ufw, ...) leave
// behind with policy drop. With br_netfilter even bridged pod-to-pod
// traffic passes its forward hook, and a verdict of accept in our own
// table does not stop their chain from dropping, so the accepts have to be
// inside their chain.
const (
	filterTable  = "filter"
	forwardChain = "FORWARD"
)

func (d *linuxPlane) nftConn() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(d.hostNS)))
	if err != nil {
		return nil, fmt.Errorf("dataplane: nftables: %w", err)
	}
	return c, nil
}

// ensureRules replaces our table atomically (add, delete, add: the batch
// works whether or not it existed, and a second call never duplicates) and
// puts our accepts at the head of ip filter FORWARD when that chain exists.
func (d *linuxPlane) ensureRules(n Node) error {
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	t := freshTable(c, &nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTable})
	ch := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    t,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: masqueradeExprs(n)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: nftables table ip %s: %w", natTable, err)
	}

	fwd, err := findForward(c)
	if err != nil || fwd == nil {
		return err
	}
	rules, err := c.GetRules(fwd.Table, fwd)
	if err != nil {
		return fmt.Errorf("dataplane: list ip filter FORWARD: %w", err)
	}
	want := forwardRules(n)
	if forwardAtHead(rules, want) {
		return nil
	}
	for _, r := range rules {
		if isOurs(r, want) {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("dataplane: ip filter FORWARD: %w", err)
			}
		}
	}
	// Inserting prepends, so the last wanted rule goes in first.
	for i := len(want) - 1; i >= 0; i-- {
		c.InsertRule(&nftables.Rule{Table: fwd.Table, Chain: fwd, Exprs: want[i]})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: accept %s in ip filter FORWARD: %w", n.Bridge, err)
	}
	return nil
}

// rulesReady reports that our table exists and, when ip filter FORWARD
// exists, that our accepts lead it (a firewall reload may have flushed
// them; resync then runs EnsureNode again).
func (d *linuxPlane) rulesReady(n Node) (bool, error) {
	c, err := d.nftConn()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("dataplane: list nftables tables: %w", err)
	}
	found := false
	for _, t := range tables {
		found = found || t.Name == natTable
	}
	if !found {
		return false, nil
	}
	fwd, err := findForward(c)
	if err != nil || fwd == nil {
		return err == nil, err
	}
	rules, err := c.GetRules(fwd.Table, fwd)
	if err != nil {
		return false, fmt.Errorf("dataplane: list ip filter FORWARD: %w", err)
	}
	return forwardAtHead(rules, forwardRules(n)), nil
}

// delRules removes our table and our accepts from ip filter FORWARD.
func (d *linuxPlane) delRules(n Node) error {
	return d.dropTableAndForward(natTable, forwardRules(n))
}

// dropTableAndForward removes table ip name and the rules of ip filter
// FORWARD that are one of want (the node's and the mesh's own accepts).
func (d *linuxPlane) dropTableAndForward(name string, want [][]expr.Any) error {
	c, err := d.nftConn()
	if err != nil {
		return err
	}
	dropTable(c, &nftables.Table{Family: nftables.TableFamilyIPv4, Name: name})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: remove table ip %s: %w", name, err)
	}
	fwd, err := findForward(c)
	if err != nil || fwd == nil {
		return err
	}
	rules, err := c.GetRules(fwd.Table, fwd)
	if err != nil {
		return fmt.Errorf("dataplane: list ip filter FORWARD: %w", err)
	}
	del := false
	for _, r := range rules {
		if isOurs(r, want) {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("dataplane: ip filter FORWARD: %w", err)
			}
			del = true
		}
	}
	if !del {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dataplane: remove our rules from ip filter FORWARD: %w", err)
	}
	return nil
}

// findForward returns ip filter FORWARD, or nil when no one created it.
func findForward(c *nftables.Conn) (*nftables.Chain, error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("dataplane: list nftables chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == filterTable && ch.Name == forwardChain {
			return ch, nil
		}
	}
	return nil, nil
}

// masqueradeExprs: ip saddr <cidr> ip daddr != <cluster> oifname !=
// <bridge> oifname != <mesh> counter masquerade, where <cluster> is the
// cluster range, or the node's range without one. Traffic between pods,
// on this node or across the mesh, and from the host to pods keeps its
// source; so does anything leaving by the mesh device, which the mesh's
// own rule translates only when its source is outside the node's range.
func masqueradeExprs(n Node) []expr.Any {
	inPrefix := func(p netip.Prefix, offset uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
			&expr.Cmp{Op: op, Register: 1, Data: p.Addr().AsSlice()},
		}
	}
	dst := n.CIDR
	if n.ClusterCIDR.IsValid() {
		dst = n.ClusterCIDR
	}
	e := inPrefix(n.CIDR, 12, expr.CmpOpEq) // IPv4 source address
	e = append(e, inPrefix(dst, 16, expr.CmpOpNeq)...)
	e = append(e,
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifnameBytes(n.Bridge)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifnameBytes(MeshDevice)},
		&expr.Counter{},
		&expr.Masq{},
	)
	return e
}

// forwardRules are the two accepts for ip filter FORWARD, built the way
// iptables-nft builds `-i br -j ACCEPT` and `-o br -m conntrack --ctstate
// RELATED,ESTABLISHED -j ACCEPT`, so `iptables -S` (and Docker, which runs
// it) can still list the chain. The state test is the xtables conntrack
// match: iptables-nft 1.8.9 refuses to list a chain holding a native
// `ct state` expression ("chain `FORWARD' in table `filter' is
// incompatible").
func forwardRules(n Node) [][]expr.Any {
	name := ifnameBytes(n.Bridge)
	return [][]expr.Any{
		{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictAccept},
		},
		{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Match{Name: "conntrack", Rev: 3, Info: &xt.ConntrackMtinfo3{
				ConntrackMtinfo2: xt.ConntrackMtinfo2{
					ConntrackMtinfoBase: xt.ConntrackMtinfoBase{MatchFlags: uint16(xt.ConntrackState)},
					StateMask:           ctStateBit(ctEstablished) | ctStateBit(ctRelated),
				},
			}},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictAccept},
		},
	}
}

// Conntrack infos as xt_conntrack numbers them (enum ip_conntrack_info).
const (
	ctEstablished = 0
	ctRelated     = 1
)

// ctStateBit is XT_CONNTRACK_STATE_BIT: bit 0 is INVALID, so info i is 1<<(i+1).
func ctStateBit(info uint) uint16 { return 1 << (info + 1) }

// ifnameBytes is an interface name padded to IFNAMSIZ: an exact match
// (iptables-nft shows it as `-i name`, without the `+` wildcard).
func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// forwardAtHead reports that the chain starts with exactly our rules and
// holds no other copy of them.
func forwardAtHead(rules []*nftables.Rule, want [][]expr.Any) bool {
	if len(rules) < len(want) {
		return false
	}
	for i, w := range want {
		if exprSig(rules[i].Exprs) != exprSig(w) {
			return false
		}
	}
	for _, r := range rules[len(want):] {
		if isOurs(r, want) {
			return false
		}
	}
	return true
}

func isOurs(r *nftables.Rule, want [][]expr.Any) bool {
	s := exprSig(r.Exprs)
	for _, w := range want {
		if s == exprSig(w) {
			return true
		}
	}
	return false
}

// exprSig renders the parts of a rule that identify it, leaving out what
// the kernel changes (counter values), so a rule read back compares equal
// to the one we built.
func exprSig(es []expr.Any) string {
	var b strings.Builder
	for _, e := range es {
		switch e := e.(type) {
		case *expr.Meta:
			fmt.Fprintf(&b, "meta %d %v r%d;", e.Key, e.SourceRegister, e.Register)
		case *expr.Cmp:
			fmt.Fprintf(&b, "cmp %d r%d %x;", e.Op, e.Register, e.Data)
		case *expr.Counter:
			b.WriteString("counter;")
		case *expr.Verdict:
			fmt.Fprintf(&b, "verdict %d %s;", e.Kind, e.Chain)
		case *expr.Match:
			info, err := xt.Marshal(xt.TableFamily(unix.NFPROTO_IPV4), e.Rev, e.Info)
			if err != nil {
				info = []byte("?")
			}
			fmt.Fprintf(&b, "match %s %d %s;", e.Name, e.Rev, hex.EncodeToString(bytes.TrimRight(info, "\x00")))
		default:
			fmt.Fprintf(&b, "%T %+v;", e, e)
		}
	}
	return b.String()
}

// dropTable queues the removal of table t whether or not it exists (the
// add makes the delete valid when it does not).
func dropTable(c *nftables.Conn, t *nftables.Table) {
	c.AddTable(t)
	c.DelTable(t)
}

// freshTable queues table t emptied of whatever it held, in the same
// transaction as what the caller adds to it next.
func freshTable(c *nftables.Conn, t *nftables.Table) *nftables.Table {
	dropTable(c, t)
	return c.AddTable(t)
}
