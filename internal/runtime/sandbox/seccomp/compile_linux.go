package seccomp

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// Offsets in struct seccomp_data (little-endian: an argument's low word
// comes first; amd64 and arm64 are both little-endian).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// Return values (SECCOMP_RET_*): the action in the high 16 bits, data
// (an errno) in the low 16.
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retTrap        = 0x00030000
	retErrno       = 0x00050000
	retTrace       = 0x7ff00000
	retLog         = 0x7ffc0000
	retAllow       = 0x7fff0000

	ePERM = 1
)

var errUnsupportedArch = errors.New("seccomp filters are built only for amd64 and arm64 (no system call table for this architecture)")

// cond is one argument comparison; alternatives of a rule are ORed, the
// conditions of one alternative ANDed.
type cond struct {
	index  uint
	op     specs.LinuxSeccompOperator
	value  uint64
	value2 uint64
}

type rule struct {
	ret  uint32
	alts [][]cond // empty: unconditional
}

// actionRet is the filter's return value for an OCI action.
func actionRet(act specs.LinuxSeccompAction, errno *uint, where string) (uint32, error) {
	e := uint(ePERM)
	if errno != nil {
		e = *errno
	}
	if e > 0xffff {
		return 0, fmt.Errorf("%s: errnoRet %d is out of range (0-65535)", where, e)
	}
	switch act {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		return retErrno | uint32(e), nil
	case specs.ActTrace:
		return retTrace | uint32(e), nil
	case specs.ActKill, specs.ActKillThread:
		return retKillThread, nil
	case specs.ActKillProcess:
		return retKillProcess, nil
	case specs.ActTrap:
		return retTrap, nil
	case specs.ActLog:
		return retLog, nil
	case specs.ActNotify:
		return 0, fmt.Errorf("%s: SCMP_ACT_NOTIFY needs a seccomp agent, which k3sm does not run: use SCMP_ACT_ERRNO or SCMP_ACT_ALLOW", where)
	case "":
		return 0, fmt.Errorf("%s: no action: set one of SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS, SCMP_ACT_KILL_THREAD, SCMP_ACT_TRAP, SCMP_ACT_TRACE, SCMP_ACT_LOG", where)
	}
	return 0, fmt.Errorf("%s: unknown action %q: use one of SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS, SCMP_ACT_KILL_THREAD, SCMP_ACT_TRAP, SCMP_ACT_TRACE, SCMP_ACT_LOG", where, act)
}

// precedence orders return values as the kernel does when several
// filters disagree (most restrictive first); compile applies the same
// order to rules of one system call.
func precedence(ret uint32) int32 { return int32(ret & 0xffff0000) }

// compile turns a resolved OCI profile into a filter for the native
// architecture. The filter checks the audit arch (another one kills the
// process: a 32-bit entry point would read the wrong table), kills x32
// calls on amd64, then finds the call by a binary search over ranges of
// system call numbers that share one outcome.
func compile(p *specs.LinuxSeccomp) ([]sandbox.SockFilter, error) {
	if sysnums == nil {
		return nil, errUnsupportedArch
	}
	if p == nil {
		return nil, errors.New("no profile")
	}
	if len(p.Flags) > 0 {
		return nil, fmt.Errorf("flags %v are not supported: remove them from the profile", p.Flags)
	}
	if p.ListenerPath != "" || p.ListenerMetadata != "" {
		return nil, errors.New("listenerPath needs a seccomp agent, which k3sm does not run: remove it from the profile")
	}
	if len(p.Architectures) > 0 && !slices.Contains(p.Architectures, nativeArch) {
		return nil, fmt.Errorf("architectures %v do not include this node's %s: add it", p.Architectures, nativeArch)
	}
	defRet, err := actionRet(p.DefaultAction, p.DefaultErrnoRet, "defaultAction")
	if err != nil {
		return nil, err
	}

	byNr := map[uint32][]rule{}
	for i, sc := range p.Syscalls {
		where := fmt.Sprintf("syscalls[%d]", i)
		if len(sc.Names) > 0 {
			where += " (" + sc.Names[0] + ")"
		}
		if len(sc.Names) == 0 {
			return nil, fmt.Errorf("%s: no names: list the system calls the rule is for", where)
		}
		ret, err := actionRet(sc.Action, sc.ErrnoRet, where)
		if err != nil {
			return nil, err
		}
		r := rule{ret: ret}
		seen := map[uint]int{}
		var conds []cond
		for j, a := range sc.Args {
			if a.Index > 5 {
				return nil, fmt.Errorf("%s.args[%d]: index %d: a system call has arguments 0 to 5", where, j, a.Index)
			}
			switch a.Op {
			case specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual, specs.OpEqualTo,
				specs.OpGreaterEqual, specs.OpGreaterThan, specs.OpMaskedEqual:
			default:
				return nil, fmt.Errorf("%s.args[%d]: unknown op %q: use SCMP_CMP_EQ, SCMP_CMP_NE, SCMP_CMP_LT, SCMP_CMP_LE, SCMP_CMP_GT, SCMP_CMP_GE or SCMP_CMP_MASKED_EQ", where, j, a.Op)
			}
			seen[a.Index]++
			conds = append(conds, cond{index: a.Index, op: a.Op, value: a.Value, value2: a.ValueTwo})
		}
		repeated := false
		for _, n := range seen {
			repeated = repeated || n > 1
		}
		switch {
		case len(conds) == 0:
		case repeated:
			// runc's reading: several comparisons of one argument in a
			// rule are alternatives (opencontainers/runc#2735).
			for _, c := range conds {
				r.alts = append(r.alts, []cond{c})
			}
		default:
			r.alts = [][]cond{conds}
		}
		for _, name := range sc.Names {
			nr, ok := sysnums[name]
			if !ok {
				// Profiles list calls of every architecture; as runc does,
				// a name this one lacks is skipped.
				continue
			}
			byNr[nr] = append(byNr[nr], r)
		}
	}

	c := &compiler{a: &asm{}, pool: map[uint32]label{}, def: defRet}
	kill := c.retLabel(retKillProcess)
	nrLabel := c.a.newLabel()
	c.a.ld(offArch)
	c.a.jump(bpfJeqK, auditArch, nrLabel, kill)
	c.a.mark(nrLabel)
	c.a.ld(offNr)
	segs := c.segments(byNr)
	treeLabel := c.labelFor(segs)
	if x32Bit != 0 {
		c.a.jump(bpfJgeK, x32Bit, kill, treeLabel)
	} else {
		c.a.jmp(treeLabel)
	}
	if !segs.simple() {
		c.emit(segs, treeLabel)
	}
	for _, ret := range c.order {
		c.a.mark(c.pool[ret])
		c.a.ret(ret)
	}
	return c.a.assemble()
}

type compiler struct {
	a     *asm
	pool  map[uint32]label // one shared return instruction per value
	order []uint32
	def   uint32
}

func (c *compiler) retLabel(ret uint32) label {
	if l, ok := c.pool[ret]; ok {
		return l
	}
	l := c.a.newLabel()
	c.pool[ret] = l
	c.order = append(c.order, ret)
	return l
}

// seg is a range of system call numbers from start up to the next seg's
// start: one return value for all of them, or (rules != nil) the rules of
// the single call start.
type seg struct {
	start uint32
	ret   uint32
	rules []rule
}

type segList []seg

func (s segList) simple() bool { return len(s) == 1 && s[0].rules == nil }

// segments sorts the calls' rules by precedence, drops what an
// unconditional rule makes unreachable, and merges neighbouring numbers
// with the same plain outcome into one range.
func (c *compiler) segments(byNr map[uint32][]rule) segList {
	nrs := make([]uint32, 0, len(byNr))
	for nr := range byNr {
		nrs = append(nrs, nr)
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	segs := segList{{start: 0, ret: c.def}}
	add := func(s seg) {
		if last := segs[len(segs)-1]; last.start == s.start {
			segs = segs[:len(segs)-1] // s replaces the default after the previous call
		}
		if n := len(segs); n > 0 && s.rules == nil && segs[n-1].rules == nil && segs[n-1].ret == s.ret {
			return
		}
		segs = append(segs, s)
	}
	for _, nr := range nrs {
		rules := slices.Clone(byNr[nr])
		sort.SliceStable(rules, func(i, j int) bool { return precedence(rules[i].ret) < precedence(rules[j].ret) })
		for i, r := range rules {
			if len(r.alts) == 0 {
				rules = rules[:i+1]
				break
			}
		}
		s := seg{start: nr}
		if len(rules[0].alts) == 0 {
			s.ret = rules[0].ret
		} else {
			s.rules = rules
		}
		add(s)
		if nr != ^uint32(0) {
			add(seg{start: nr + 1, ret: c.def})
		}
	}
	return segs
}

func (c *compiler) labelFor(s segList) label {
	if s.simple() {
		return c.retLabel(s[0].ret)
	}
	return c.a.newLabel()
}

// emit lays out the search over s at l (A holds the call number).
func (c *compiler) emit(s segList, l label) {
	c.a.mark(l)
	if len(s) == 1 {
		c.rules(s[0].rules)
		return
	}
	mid := len(s) / 2
	left, right := s[:mid], s[mid:]
	ll, rl := c.labelFor(left), c.labelFor(right)
	c.a.jump(bpfJgeK, right[0].start, rl, ll)
	if !left.simple() {
		c.emit(left, ll)
	}
	if !right.simple() {
		c.emit(right, rl)
	}
}

// rules checks one call's rules in order; the first that holds returns.
func (c *compiler) rules(rules []rule) {
	for _, r := range rules {
		if len(r.alts) == 0 {
			c.a.jmp(c.retLabel(r.ret))
			return
		}
		for _, alt := range r.alts {
			next := c.a.newLabel()
			for i, cd := range alt {
				pass := c.retLabel(r.ret)
				var after label
				if i < len(alt)-1 {
					after = c.a.newLabel()
					pass = after
				}
				c.cond(cd, pass, next)
				if after != 0 {
					c.a.mark(after)
				}
			}
			c.a.mark(next)
		}
	}
	c.a.jmp(c.retLabel(c.def))
}

// cond compares a 64-bit argument in two 32-bit halves.
func (c *compiler) cond(cd cond, pass, fail label) {
	lo := uint32(offArgs + 8*cd.index)
	hi := lo + 4
	vhi, vlo := uint32(cd.value>>32), uint32(cd.value)
	a := c.a
	l1, l2 := a.newLabel(), a.newLabel()
	if cd.op == specs.OpMaskedEqual && vhi == 0 {
		// A mask with no high bits (flags, an int argument): the high
		// half cannot matter.
		if uint32(cd.value2>>32) != 0 {
			a.jmp(fail)
			return
		}
		a.ld(lo)
		a.and(vlo)
		a.jump(bpfJeqK, uint32(cd.value2), pass, fail)
		return
	}
	a.ld(hi)
	switch cd.op {
	case specs.OpEqualTo:
		a.jump(bpfJeqK, vhi, l1, fail)
		a.mark(l1)
		a.ld(lo)
		a.jump(bpfJeqK, vlo, pass, fail)
	case specs.OpNotEqual:
		a.jump(bpfJeqK, vhi, l1, pass)
		a.mark(l1)
		a.ld(lo)
		a.jump(bpfJeqK, vlo, fail, pass)
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		a.jump(bpfJgtK, vhi, pass, l1)
		a.mark(l1)
		a.jump(bpfJeqK, vhi, l2, fail)
		a.mark(l2)
		a.ld(lo)
		op := uint16(bpfJgtK)
		if cd.op == specs.OpGreaterEqual {
			op = bpfJgeK
		}
		a.jump(op, vlo, pass, fail)
	case specs.OpLessThan, specs.OpLessEqual:
		a.jump(bpfJgtK, vhi, fail, l1)
		a.mark(l1)
		a.jump(bpfJeqK, vhi, l2, pass)
		a.mark(l2)
		a.ld(lo)
		op := uint16(bpfJgeK)
		if cd.op == specs.OpLessEqual {
			op = bpfJgtK
		}
		a.jump(op, vlo, fail, pass)
	case specs.OpMaskedEqual:
		mhi, mlo := vhi, vlo
		whi, wlo := uint32(cd.value2>>32), uint32(cd.value2)
		a.and(mhi)
		a.jump(bpfJeqK, whi, l1, fail)
		a.mark(l1)
		a.ld(lo)
		a.and(mlo)
		a.jump(bpfJeqK, wlo, pass, fail)
	}
}
